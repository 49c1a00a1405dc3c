#!/usr/bin/env bash
# Launches train_gpt for a GPT-2 reproduction and restarts it with --resume until it completes, so a
# crashed run continues from its latest complete checkpoint. A preempted run (exit status 75: it got
# SIGTERM or SIGUSR1 and wrote a checkpoint) ends this script with 75 too; run it again to resume.
#   scripts/run_gpt2.sh OUT_DIR [train_gpt flags...]
# Environment:
#   NGPU        ranks on this node (default: all GPUs nvidia-smi lists)
#   HOSTFILE    an mpirun hostfile for several nodes (then NGPU is the total rank count)
#   LAUNCHER    "mpirun" (default) or "srun" (inside a Slurm allocation: one task per GPU)
#   TRAIN_GPT   the binary (default ./train_gpt)
#   MAX_TRIES   restarts before giving up (default 100)
#   DATA_DIR    token shards train_*.bin and val_*.bin, as data/prepare.py writes them from FineWeb's
#               parquet files (README, "Run scripts"; default data/fineweb10B)
#   TRAIN_DATA / VAL_DATA  globs that replace DATA_DIR's, e.g. for llm.c's own fineweb_train_*.bin names
set -euo pipefail
out=${1:?usage: run_gpt2.sh OUT_DIR [train_gpt flags...]}
shift
binary=${TRAIN_GPT:-./train_gpt}
ngpu=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "$ngpu" -ge 1 ] || { echo "run_gpt2.sh: no GPU found; set NGPU" >&2; exit 1; }
data=${DATA_DIR:-data/fineweb10B}
train=${TRAIN_DATA:-$data/train_*.bin}
val=${VAL_DATA:-$data/val_*.bin}
# Before launching ranks that would each fail on it: say where shards come from.
compgen -G "$train" >/dev/null || {
  echo "run_gpt2.sh: no token shard matches $train; make them with data/prepare.py (README, \"Run scripts\")" >&2
  exit 1
}
case ${LAUNCHER:-mpirun} in
  mpirun) launch=(mpirun -np "$ngpu" ${HOSTFILE:+--hostfile "$HOSTFILE"} --bind-to none) ;;
  srun) launch=(srun --ntasks="$ngpu" --gpus-per-task=1 --cpu-bind=none) ;;
  *) echo "run_gpt2.sh: LAUNCHER must be mpirun or srun" >&2; exit 1 ;;
esac
mkdir -p "$out"
resume=()
for try in $(seq 1 "${MAX_TRIES:-100}"); do
  # Resume whenever a complete checkpoint exists (train_gpt picks the latest one with its marker).
  if ls "$out"/state_*.bin.done >/dev/null 2>&1; then resume=(-y); fi
  status=0
  "${launch[@]}" "$binary" -i "$train" -j "$val" -o "$out" "${resume[@]}" "$@" || status=$?
  if [ "$status" -eq 0 ]; then
    echo "run_gpt2.sh: finished ($out)"
    exit 0
  fi
  # 75: preempted (SIGTERM, or SIGUSR1 as Slurm's --signal and mpirun forward it): the step's checkpoint
  # is written. Stop here; running this script again (or requeueing the job) resumes.
  if [ "$status" -eq 75 ]; then
    echo "run_gpt2.sh: preempted; checkpoint written in $out; exiting with 75 (run again to resume)" >&2
    exit 75
  fi
  echo "run_gpt2.sh: attempt $try failed; restarting from the latest checkpoint in 30 s" >&2
  sleep 30
done
echo "run_gpt2.sh: giving up after ${MAX_TRIES:-100} attempts" >&2
exit 1
