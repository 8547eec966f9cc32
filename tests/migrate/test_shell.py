"""fasync.shell: the command line a launch script runs, evaluated without running it."""

from fasync.shell import evaluate, shown, unknown_in


def _command(text: str, **environment: str):
    script = evaluate(text, environment)
    command = script.training_command()
    assert command is not None, script
    return script, command.program, [shown(word) for word in command.words]


def test_defaults_nested_arithmetic_arrays_exports_and_continuations():
    _, program, words = _command("""\
export NNODES=${NNODES:-2}
MODEL=${MODEL_PATH:-"${HOME_DIR:-/data}/models/${MODEL_ID:-qwen}"}
LEN=$((1024 * 8))
STEPS=$(((512*100)))
GPUS=$((NNODES * 8))
ARGS=(
   --lr 1e-6   # the rate
   #--commented-out 1
   --model "${MODEL}" \\
   --colocate
)
python3 train.py "${ARGS[@]}" --len ${LEN} \\
    --gpus $GPUS --steps $STEPS ${UNSET_ARRAY[@]}
""")
    assert program == "train.py"
    assert words == ["--lr", "1e-6", "--model", "/data/models/qwen", "--colocate", "--len", "8192", "--gpus", "16",
                     "--steps", "51200"]


def test_wrappers_are_unwrapped():
    _, program, words = _command("""\
N=4
srun --nodes=1 -w node1 bash -c \\
  "pip install ray && ray job submit --address=http://x:8265 -- python3 -m openrlhf.cli.train_ppo_ray \\
   --n_samples_per_prompt $N --flag" &>> log &
""")
    assert program == "openrlhf.cli.train_ppo_ray" and words == ["--n_samples_per_prompt", "4", "--flag"]


def test_if_takes_the_branch_the_scripts_values_select_and_says_so():
    text = """\
STRATEGY=${STRATEGY:-fsdp2}
if [ "${STRATEGY}" == "fsdp2" ]; then
    python3 -m recipe.main a=1
elif [ "${STRATEGY}" == "megatron" ]; then
    python3 -m recipe.main a=2 b=3 c=4
else
    exit 1
fi
"""
    script, _, words = _command(text)
    assert words == ["a=1"] and any("true with the script's values" in note for note in script.notes)
    _, _, words = _command(text, STRATEGY="megatron")
    assert words == ["a=2", "b=3", "c=4"]


def test_an_undecidable_condition_takes_the_first_branch_and_says_so():
    script, _, words = _command("""\
COUNT=$(nvidia-smi | wc -l)
if [ "$COUNT" -gt 0 ]; then X=1; else X=2; fi
python3 train.py --x $X
""")
    assert words == ["--x", "1"] and any("cannot be decided" in note for note in script.notes)


def test_unknown_values_are_marked_and_positional_arguments_come_from_the_environment():
    script, _, words = _command('CP="${1:-1}"\npython3 train.py --cp $CP --home $HOME --all "$@"\n', **{"1": "2"})
    assert words[:2] == ["--cp", "2"] and unknown_in(evaluate("python3 train.py --home $HOME\n").training_command()
                                                     .words[1]) == ["${HOME}"]
    assert words[-1] == "2"  # "$@"


def test_malformed_scripts_end():
    """Unbalanced quotes, parentheses, braces and arithmetic end the evaluation instead of looping."""
    for text in ('python3 train.py --x "open', "X=( a b; python3 train.py ${X[@]", "${", "$((x", "X=$((1/0))",
                 "if [ ; then python3 train.py --n 3; fi", "python3 train.py --n $(( ", "X=(\n--a 1 ) ) )"):
        evaluate(text + "\n")


def test_arithmetic_bombs_stay_unknown():
    """A crafted script or launcher must not make the import compute without end."""
    from fasync.python_launcher import config_keywords

    script, _, words = _command("python3 train.py --a $((9**9**9)) --b $((2**10))\n")
    assert words == ["--a", "$((9**9**9))", "--b", "1024"]
    _, keywords = config_keywords("X = [1] * 10**9\nY = 'a' * 10**9\nZ = 9 ** 9 ** 9\nN = 4 * 8\n"
                                  "GRPOConfig(a=X, b=Y, c=Z, n=N)\n", {})
    assert keywords == {"n": 32}


def test_a_line_bash_rejects_is_left_out_and_named_with_its_file_and_line():
    """A `<PLACEHOLDER>` left for the user is not bash (tree-sitter-bash finds an error there): the line is read as
    if it were absent, the note names it, and the rest of the script is evaluated as usual."""
    script, program, words = _command("ROOT=<PATH_TO_ROOT>\nN=${N:-4}\npython3 train.py --n $N --root $ROOT\n")
    assert (program, words[:3]) == ("train.py", ["--n", "4", "--root"])
    assert unknown_in(script.training_command().words[3]) == ["${ROOT}"]
    script = evaluate("ROOT=<PATH_TO_ROOT>\n", origin="run.sh")
    assert script.notes == ["run.sh:1: not valid bash (`ROOT=<PATH_TO_ROOT>`): left out"]


def test_words_after_a_redirection_are_still_arguments():
    """`--url https://<host>.hf.space` is two redirections to bash; the words after them still belong to the
    command."""
    _, _, words = _command("python3 train.py --url https://<host>.hf.space --model m 2>&1\n")
    assert words == ["--url", "https://", "--model", "m"]


def test_nesting_deeper_than_python_recurses_is_a_note():
    script = evaluate("X=" + "${A:-" * 3000 + "z" + "}" * 3000 + "\npython3 train.py\n")
    assert any("nested deeper" in note for note in script.notes)
