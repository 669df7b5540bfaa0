#!/bin/bash
# One calibration run of glyphs_xl: a triplet baseline (small CNN), one thread; records its command, CPU time and the
# R@1 of the epoch selected on the validation split as NAME.json beside this script.
# usage (project venv on PATH): results/calibration/run.sh NAME [dml-book train flags...]
set -e
here=$(cd "$(dirname "$0")" && pwd); work=${CAL_DIR:-/tmp/dml_book_calibration}; mkdir -p "$work"
export OMP_NUM_THREADS=1 MPLBACKEND=Agg PYTHONHASHSEED=0
name=$1; shift
cmd="dml-book train --dataset glyphs_xl --no-umap --no-progress --out $work/$name $*"
/usr/bin/time -f "%U %S %e" -o "$work/$name.time" $cmd > "$work/$name.log" 2>&1
python - "$name" "$cmd" "$work" "$here" <<'PY'
import json, sys
name, cmd, work, here = sys.argv[1:]
u, s, e = map(float, open(f"{work}/{name}.time").read().split()[-3:])
m = json.load(open(f"{work}/{name}/metrics.json"))
rec = dict(name=name, command=cmd.replace(f"{work}/{name}", "OUT"), cpu_seconds=round(u+s, 1), wall_seconds=e,
           selected_epoch=m["selected"]["epoch"], val_R1=m["selected"]["validation"]["R@1"], test_R1=m["selected"]["test"]["R@1"],
           curve=[dict(epoch=r["epoch"], val_R1=r.get("val_R@1"), test_R1=r.get("R@1")) for r in m["epochs"] if r.get("kind") == "epoch"])
json.dump(rec, open(f"{here}/{name}.json", "w"), indent=1)
print(json.dumps({k: v for k, v in rec.items() if k != "curve"}))
PY
