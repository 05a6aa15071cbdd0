#!/usr/bin/env python3
"""Every example job file must satisfy schema/job.schema.json, and known-bad documents must not.

Exit 77 (CTest: skipped) when python3-jsonschema is not installed."""
import glob
import json
import os
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema not installed; skipping")
    sys.exit(77)

root = sys.argv[1]
schema = json.load(open(os.path.join(root, "schema", "job.schema.json")))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
failures = 0
examples = sorted(glob.glob(os.path.join(root, "examples", "**", "*.json"), recursive=True))
for path in examples:
    for err in validator.iter_errors(json.load(open(path))):
        print(f"{path}: {'/'.join(map(str, err.absolute_path))}: {err.message}")
        failures += 1
bad = [
    {"stages": [{"name": "a", "program": "noop", "replcas": 2}]},
    {"stages": [{"name": "a", "program": "noop"}], "edges": [{"from": "a", "to": "a", "channel": "tcp"}]},
    {"stages": []},
]
for doc in bad:
    if validator.is_valid(doc):
        print(f"schema accepted a bad document: {doc}")
        failures += 1
# Every channel kind the job parser knows (jobmanager/job_spec.cc), on an edge and as a default.
kinds = ["file", "memory", "durable", "mirrored", "stream", "shm", "nccl", "order"]
good = [{"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"}],
         "edges": [{"from": "a", "to": "b", "channel": k}], "defaults": {"channel": k}} for k in kinds]
for doc in good:
    for err in validator.iter_errors(doc):
        print(f"schema refused a good document ({doc['edges'][0]['channel']}): {err.message}")
        failures += 1
print(f"{len(examples)} examples checked against the schema")
print(f"{len(examples) + len(bad) + len(good) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
