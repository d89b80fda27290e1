# Issue 25 (theory.md 11.12): register the finite-run horizon model for windows (the first T updates)
# of the registered grids, from the panel runs of results/horizon_phase and results/horizon_calibration.
# Run from the repository root with the project installed: bash experiments/register_windows.sh
set -e
cd "$(dirname "$0")/.."
PY="python -m llm_experiments.study.window_predict"
G8="results/horizon_phase/runs/seed=*_lr=0.0001_* results/horizon_calibration/runs/seed=0_lr=0.0001_f05b3492"
G4="results/horizon_phase/runs/seed=0_group_size=4_* results/horizon_calibration/runs/seed=*_group_size=4_*"
LR2="results/horizon_phase/runs/seed=0_lr=0.0002_* results/horizon_calibration/runs/seed=*_lr=0.0002_*"
# "a test" below means only that the window had not been scored: every curve it scores already
# existed, so its prediction is one made after the curves existed, not a blind test (issue 38).
NEW="Registered before this window was scored: a test."
SEEN="This window is the whole run, already judged (the base verdict): a development check, not a test."
PART="Partly seen: the first 100 updates of these runs were scored as horizon_short's runs where the cells are shared (identical or near-identical prefixes): a development check."
reg() { # base name T seen panels...
  base=$1; name=$2; T=$3; seen=$4; shift 4
  echo "== $name T=$T"
  $PY --base $base --steps $T --name ${name}_T$T --out results/windows/${name}_T$T --panels "$@" \
      --note "Issue 25, theory.md 11.12: the finite-run horizon model for the first $T updates of $name's runs. $seen"
}
for T in 50 150 200; do reg results/cpu_sweep_v3/preregistration.json cpu_sweep_v3 $T "$NEW" $G8; done
reg results/cpu_sweep_v3/preregistration.json cpu_sweep_v3 100 "$PART" $G8
reg results/cpu_sweep_v3/preregistration.json cpu_sweep_v3 300 "$SEEN" $G8
for T in 30 50; do reg results/horizon_short/prediction.json horizon_short $T "$NEW" $G8; done
reg results/horizon_short/prediction.json horizon_short 100 "$SEEN" $G8
for T in 30 50; do reg results/horizon_lr2/prediction.json horizon_lr2 $T "$NEW" $LR2; done
reg results/horizon_lr2/prediction.json horizon_lr2 100 "$SEEN" $LR2
for T in 30 50; do reg results/horizon_g4/prediction.json horizon_g4 $T "$NEW" $G4; done
reg results/horizon_g4/prediction.json horizon_g4 100 "$SEEN" $G4
