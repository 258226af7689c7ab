#!/usr/bin/env bash
# ../shared/GPU.md's checklist as one command on the lent GPU machine (the `device` tool runs
# it in the repository root; what it writes under $OUT comes back):
#   1. the project installed against the machine's own packages (no dependency resolution);
#   2. bench/gpu_profile.py: the scoring call's and a sampling stage's profiles (issue 57);
#   3. `make test-gpu`'s group, then every other test file on its own, each with its own log
#      and exit status in $OUT/tests.tsv, until BUDGET seconds are spent (files not reached
#      are listed as such): the file of a failure with the GPU visible is then named. In
#      tests.tsv, rc 1 is a failed test; rc 2 a file that could not be collected (a package
#      the image lacks, say: its log says which); rc 124 the budget ran out inside the file.
#
#   OUT=... BUDGET=420 bash scripts/gpu_checklist.sh [--no-profile]
set -u
OUT=${OUT:?OUT names the folder for the logs}
BUDGET=${BUDGET:-420}
started=$(date +%s)
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
echo "install rc=$?" >> "$OUT/steps.txt"
if [ "${1:-}" != "--no-profile" ]; then
    (cd bench && timeout 300 python3 gpu_profile.py --out "$OUT") > "$OUT/profile.log" 2>&1
    echo "profile rc=$?" >> "$OUT/steps.txt"
fi
printf 'file\trc\tseconds\n' > "$OUT/tests.tsv"
for file in tests/test_gpu.py $(ls tests/test_*.py | grep -v test_gpu.py); do
    left=$((BUDGET - ($(date +%s) - started)))
    if [ "$left" -le 10 ]; then
        printf '%s\tnot reached\t\n' "$file" >> "$OUT/tests.tsv"
        continue
    fi
    name=$(basename "$file" .py)
    begun=$(date +%s)
    HF_HUB_OFFLINE=1 timeout "$left" python3 -m pytest -x -q -ra -p no:cacheprovider "$file" \
        > "$OUT/$name.log" 2>&1
    printf '%s\t%s\t%s\n' "$file" "$?" "$(($(date +%s) - begun))" >> "$OUT/tests.tsv"
done
cat "$OUT/steps.txt" "$OUT/tests.tsv"
