"""`fasync bench`: the three drivers on the same task and model, measured against the overlap limit."""
