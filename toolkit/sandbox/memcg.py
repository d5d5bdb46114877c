"""Per-worker memory cgroups (host side): where one may be created, creating and removing it.
The worker caps each call's processes and tmpfs pages with it (`worker._WServer.cg_limit`)."""

from __future__ import annotations

import os
import sys
import time

_MEMCG_PARENT: tuple | None = None


def _memcg_parent() -> tuple[str, str] | None:
    """A memory cgroup directory we may create children in: (dir, "v1"|"v2"), or None."""
    global _MEMCG_PARENT
    if _MEMCG_PARENT is not None:
        return _MEMCG_PARENT or None
    found: tuple = ()
    if os.environ.get("TOOLKIT_SANDBOX_CGROUP", "1") != "0" and sys.platform.startswith("linux"):
        try:
            with open("/proc/self/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
            if "memory" in ctrls.split(","):
                d = "/sys/fs/cgroup/memory" + path.rstrip("/")
                if os.path.isfile(os.path.join(d, "memory.limit_in_bytes")) and os.access(d, os.W_OK):
                    found = (d, "v1")
                    break
            elif hid == "0" and ctrls == "":
                d = "/sys/fs/cgroup" + path.rstrip("/")
                try:
                    with open(os.path.join(d, "cgroup.subtree_control")) as f:
                        ok = "memory" in f.read().split()
                except OSError:
                    ok = False
                if ok and os.access(d, os.W_OK):
                    found = (d, "v2")
    _MEMCG_PARENT = found
    return found or None


def _make_memcg(name: str) -> dict | None:
    parent = _memcg_parent()
    if parent is None:
        return None
    d = os.path.join(parent[0], name)
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    except OSError:
        return None
    return {"dir": d, "v": parent[1]}


def _remove_memcg(memcg: dict | None) -> None:
    if memcg and memcg.get("dir") and os.path.basename(memcg["dir"]).startswith("toolkit-sandbox-"):
        for _ in range(50):
            try:
                os.rmdir(memcg["dir"])
                return
            except FileNotFoundError:
                return
            except OSError:  # still has a dying process in it
                time.sleep(0.02)
