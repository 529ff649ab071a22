"""Shared test set-up: the tiny model built once per session by tools/make_tiny.py."""
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
