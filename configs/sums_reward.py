"""The reward of configs/own_data.yaml, written as verl writes one: fasync passes it the fields it names."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 for the exact sum, 0.5 for its first digit right, else 0."""
    answer = solution_str.strip()
    if answer == ground_truth:
        return 1.0
    return 0.5 if answer[:1] == ground_truth[:1] else 0.0
