"""A one-machine Slurm cluster for tests: munged + slurmctld + slurmd started as this process's
children, each with its own config, key, socket, state, spool and log files under one directory.

    with LocalSlurm(tmp_dir) as s:            # waits until `sinfo` shows the node idle
        s.run(["sbatch", "--wait", ...])      # SLURM_CONF points at the private slurm.conf

Debian's `slurm-wlm` (22.05) and `munge`; no cgroups (proctrack/linuxproc, task/none), no
accounting daemon. The node is `localhost` (127.0.0.1) with CPUS cpus; the daemons listen on free
loopback ports, so two runs on one machine do not collide. Needs root (slurmd runs jobs as the
submitting user and must be able to setuid) — `available()` says why not when it cannot run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scontrol")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for d in ("/usr/sbin", "/usr/bin")
                                       if os.access(p := f"{d}/{name}", os.X_OK)), None)


def available() -> str | None:
    """None when a local cluster can start here, else the reason it cannot."""
    missing = [d for d in DAEMONS if not _which(d)]
    if missing:
        return (f"slurm/munge binaries absent ({', '.join(missing)}): "
                "apt-get install slurm-wlm munge (Debian) to run the Slurm tests")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs (these tests start their own cluster)"
    return None


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class LocalSlurm:
    def __init__(self, root: str | os.PathLike, cpus: int = 2, memory_mb: int = 4000):
        self.root = Path(root)
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.procs: list[subprocess.Popen] = []
        self.conf = self.root / "slurm.conf"

    # -- set-up ---------------------------------------------------------------------------------
    def _write(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.socket = r / "munge" / "munge.socket"
        ctld, slurmd = _free_port(), _free_port()
        self.conf.write_text(f"""\
ClusterName=toolkittest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def env(self, **extra) -> dict:
        e = dict(os.environ)
        e["SLURM_CONF"] = str(self.conf)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def _start(self, args: list[str], name: str) -> None:
        with open(self.root / "log" / f"{name}.stdout", "w") as log:
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                               cwd=self.root, start_new_session=True))

    def start(self, timeout: float = 60) -> LocalSlurm:
        self._write()
        r = self.root
        self._start([_which("munged"), "--foreground", "--force", f"--key-file={r}/munge/munge.key",
                     f"--socket={self.socket}", f"--pid-file={r}/munge/munged.pid",
                     f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"], "munged")
        self._wait(lambda: self.socket.exists(), timeout, "munged socket")
        self._start([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._start([_which("slurmd"), "-D", "-N", "localhost", "-f", str(self.conf)], "slurmd")
        self._wait(self._idle, timeout, "sinfo to show node localhost idle")
        return self

    def _idle(self) -> bool:
        p = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True,
                           text=True, timeout=20, check=False)
        return p.returncode == 0 and "localhost idle" in p.stdout

    def _wait(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while waiting for {what}:\n{self.logs()}")
            if cond():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # -- use ------------------------------------------------------------------------------------
    def run(self, args: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        env = kw.pop("env", None) or self.env()
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kw)

    def job_state(self, job_id: str) -> dict[str, str]:
        """{task id or job id: JobState} for a job (an array job lists each task)."""
        p = self.run([_which("scontrol"), "-o", "show", "job", job_id], timeout=30)
        states = {}
        for line in p.stdout.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            states[f.get("JobId", "?") + ("_" + f["ArrayTaskId"] if "ArrayTaskId" in f else "")] = f.get("JobState", "?")
        return states

    def wait_job(self, job_id: str, timeout: float = 600) -> dict[str, str]:
        """Wait until every task of the job is finished; return their states."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = self.job_state(job_id)
            if st and all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                                "BOOT_FAIL", "DEADLINE", "PREEMPTED") for s in st.values()):
                return st
            time.sleep(1)
        raise TimeoutError(f"job {job_id} not finished after {timeout}s: {self.job_state(job_id)}\n{self.logs()}")

    # -- tear-down ------------------------------------------------------------------------------
    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        self.procs.clear()

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
