"""Loads gacctl's CSV export with pandas as is, and checks it against the
JSON Lines export of the same records read with Python's json module:
same rows, same values, sensible dtypes. Exit 77 (skipped) without pandas.

usage: check_pandas.py STEPS.csv STEPS.jsonl
"""
import json
import math
import sys

try:
    import pandas as pd
except ImportError:
    print("pandas is not installed (scripts/setup.sh puts it in .venv)")
    sys.exit(77)


def main(csv_path, jsonl_path):
    with open(jsonl_path) as f:
        records = [json.loads(line) for line in f]
    # pandas 3 parses floats exactly by default (float_precision is
    # deprecated); before it, only float_precision="round_trip" was exact.
    exact_default = int(pd.__version__.split(".")[0]) >= 3
    frames = {"default": pd.read_csv(csv_path)}
    if not exact_default:
        frames["round_trip"] = pd.read_csv(csv_path, float_precision="round_trip")
    problems = []
    worst = 0.0
    for how, df in frames.items():
        if len(df) != len(records):
            problems.append(f"{how}: {len(df)} rows, {len(records)} records")
            continue
        for column, dtype in [("step", "int64"), ("rank", "int64"), ("wall_time_ns", "int64"),
                              ("cosine", "float64"), ("alpha", "float64"), ("fallback", "bool"),
                              ("regime", "object|str")]:
            if str(df[column].dtype) not in dtype.split("|"):  # pandas 3: strings are "str"
                problems.append(f"{how}: column {column} is {df[column].dtype}, not {dtype}")
        for i, record in enumerate(records):
            row = df.iloc[i]
            for key, want in record.items():
                got = row[key]
                if want is None:
                    ok = isinstance(got, float) and math.isnan(got)
                elif isinstance(want, bool) or isinstance(want, str) or isinstance(want, int):
                    ok = got == want
                elif how == "round_trip" or exact_default:
                    ok = float(got) == want
                else:
                    # pandas' default float parser (xstrtod) is not exact:
                    # with leading zeros it keeps fewer digits (about 1e-13 relative
                    # near 1e-4); float_precision="round_trip" is exact.
                    ok = math.isclose(float(got), want, rel_tol=1e-12, abs_tol=1e-300)
                    worst = max(worst, abs(float(got) - want) / abs(want) if want else 0.0)
                if not ok:
                    problems.append(f"{how}: row {i} {key}: csv {got!r}, jsonl {want!r}")
        extra = set(df.columns) - set().union(*(r.keys() for r in records)) - {"other_scalars"}
        if extra:
            problems.append(f"{how}: columns not in the JSON Lines: {sorted(extra)}")
    if problems:
        print("\n".join(problems[:20]))
        return 1
    print(f"pandas loaded {len(records)} rows x {len(frames['default'].columns)} columns; all values agree "
          f"(exactly with float_precision='round_trip'; the default parser within {worst:.1e} relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
