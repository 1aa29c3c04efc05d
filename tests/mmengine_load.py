"""Loads configs written by `segtune resolve --format py` with real mmengine
and compares them, value and type, with mmengine's own resolution of the
original configs (resolved/*.json).

usage: python mmengine_load.py DUMP_DIR RESOLVED_DIR REL_PATH...
Prints one line per failure and 'N passed, M failed'; exits 1 on any failure.
"""
import json
import sys

from mmengine.config import Config


def decode(obj):
    if isinstance(obj, dict) and list(obj) == ["__tuple__"]:
        return tuple(obj["__tuple__"])
    return obj


def first_difference(a, b, path="<root>"):
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{path}: keys differ: {sorted(set(a) ^ set(b))}"
        for k in a:
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}.{i}")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def main():
    dump_dir, resolved_dir, rels = sys.argv[1], sys.argv[2], sys.argv[3:]
    passed = failed = 0
    for rel in rels:
        with open(f"{resolved_dir}/{rel[:-3]}.json") as f:
            want = json.load(f, object_hook=decode)
        try:
            got = Config.fromfile(f"{dump_dir}/{rel}", import_custom_modules=False).to_dict()
            diff = first_difference(got, want)
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            diff = f"mmengine could not load it: {type(e).__name__}: {e}"
        if diff:
            failed += 1
            print(f"FAIL {rel}: {diff}")
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
