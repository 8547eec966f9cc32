"""verl's RL dataset layout, for the tests that read a verl user's data as it is."""

import pyarrow as pa
import pyarrow.parquet as pq


def verl_rows(count: int) -> list[dict]:
    """verl's RL dataset layout, as its gsm8k preprocessing writes it."""
    return [{
        "data_source": "digits",
        "prompt": [{"role": "system", "content": "answer with digits"},
                   {"role": "user", "content": f"what is {i % 10} plus one"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str((i % 10 + 1) % 10)},
        "extra_info": {"split": "train", "index": i},
    } for i in range(count)]


def write_verl_parquet(path, count: int = 12) -> None:
    pq.write_table(pa.Table.from_pylist(verl_rows(count)), path)
