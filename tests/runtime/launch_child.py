"""A child for the launcher's tests (no JAX): `python -m tests.runtime.launch_child ACTION FOLDER`.

Every child starts a sleeping grandchild in its own process group, writes both pids to
FOLDER/<process id>.pids and prints `ready`; then ACTION: `sleep` (two minutes), `die1`
(process 1 kills itself with SIGKILL, the others sleep) or `bytes` (prints a byte that is
not UTF-8, then 256 KiB, more than a pipe holds, and exits 0).
"""
import os
import signal
import subprocess
import sys
import time

action, folder = sys.argv[1], sys.argv[2]
index = int(os.environ["JAX_PROCESS_ID"])
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(folder, f"{index}.pids"), "w", encoding="utf-8") as f:
  f.write(f"{os.getpid()} {grandchild.pid}\n")
print("ready", flush=True)
if action == "bytes":
  sys.stdout.buffer.write(b"caf\xe9 \xff\n" + (b"y" * 255 + b"\n") * 1024)
  sys.stdout.flush()
  print("done", flush=True)
  sys.exit(0)
if action == "die1" and index == 1:
  os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
