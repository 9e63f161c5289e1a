source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 5 > $OUT/mem.txt 2>&1 &
SMI=$!
(CUDAGYM_FIXTURE_TIMING_MODE=paper timeout -k 10 -s INT 185 python3 -m pytest tests/eval/test_adversarial.py -k "cuda and not header" -n 12 -q -p no:cacheprovider -rA > $OUT/adv_paper.txt 2>&1; echo "adv rc=$?" >> $OUT/adv_paper.txt) &
ADV=$!
timeout -k 10 -s INT 185 python3 benchmarks/stress.py --kb-version v0.1 --timing-mode strict --only 'honest/level1/(23|36)_' --phases prebuild,lone --out $OUT/big.json --deadline-s 180 --no-eval-run > $OUT/big.txt 2>&1
wait $ADV
kill $SMI
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" $OUT/adv_paper.txt | tail -45
tail -25 $OUT/big.txt
sort -t, -k2 -n $OUT/mem.txt | tail -2
