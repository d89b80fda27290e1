# theory.md 11.15, a development check (not a test: every window here was scored before):
# the finite-run horizon model of the 14 windows (experiments/register_windows.sh) with a stale
# rollout's worth = align(g) of the large align panels (results/horizon_align_large, lr 1e-4,
# G = 8; each phase takes the align curve of the nearest align birth), judged on the windows'
# own curves. The align panels' setting is cpu_sweep_v3's and horizon_short's; for horizon_g4
# (G = 4) and horizon_lr2 (lr 2e-4) their align is carried over, an assumption.
# Run from the repository root: bash experiments/align_devcheck.sh [OUT]
set -e
cd "$(dirname "$0")/.."
OUT=${1:-results/horizon_align_large/devcheck}
G8="results/horizon_phase/runs/seed=*_lr=0.0001_* results/horizon_calibration/runs/seed=0_lr=0.0001_f05b3492"
G4="results/horizon_phase/runs/seed=0_group_size=4_* results/horizon_calibration/runs/seed=*_group_size=4_*"
LR2="results/horizon_phase/runs/seed=0_lr=0.0002_* results/horizon_calibration/runs/seed=*_lr=0.0002_*"
ALIGN="results/horizon_align_large/runs/*"
check() { # base name T panels...
  base=$1; name=$2; T=$3; shift 3
  out=$OUT/${name}_T$T
  python -m llm_experiments.study.window_predict --base $base --steps $T --name ${name}_T$T \
    --out $out --worth align --align-runs $ALIGN --panels "$@" \
    --note "theory.md 11.15 development check: worth = align of the large align panels" > /dev/null
  curves=results/${name}/curves.jsonl.gz
  python -m llm_experiments judge --registration $out/prediction.json --curves $curves \
    --out $out/validation.json > $out/judge.log
}
for T in 50 100 150 200 300; do check results/cpu_sweep_v3/preregistration.json cpu_sweep_v3 $T $G8; done
for T in 30 50 100; do check results/horizon_short/prediction.json horizon_short $T $G8; done
for T in 30 50 100; do check results/horizon_lr2/prediction.json horizon_lr2 $T $LR2; done
for T in 30 50 100; do check results/horizon_g4/prediction.json horizon_g4 $T $G4; done
