"""Run directories written by hand, without training."""

import json


def write_run_dir(root, run_id, meta, records):
    """A finished run directory `root/run_id` with `meta` as run.json and `records` as
    metrics.jsonl."""
    d = root / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(meta))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "COMPLETED").write_text(json.dumps({"step": records[-1]["step"]}))
    return d
