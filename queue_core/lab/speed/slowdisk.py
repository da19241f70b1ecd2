"""A slow disk on a fast machine: every fsync and fdatasync delayed by a fixed time.

Where users run, a consumer SSD or a cloud volume, one flush costs 1 to 10 ms;
the disk under a development machine may flush in a tenth of that. To see a
queue where the flush is the limit, ``make bench`` and ``flushcurve`` start
their processes with a shim in ``LD_PRELOAD``: a few lines of C
(``benchmarks/slowsync.c``) that sleep ``SLOWSYNC_US`` microseconds, then call
the real ``fsync`` or ``fdatasync``, and count the calls.

    env = shim_env(delay_us=2000)        # raises NoShim (with the reason) where it cannot
    subprocess.run([sys.executable, "work.py"], env=env)

``shim_library`` builds the shim into ``build/`` of the checkout with the C
compiler ``cc`` (or ``$CC``) when it is missing or older than its source;
without a compiler, on a system other than Linux, or outside a checkout it
raises ``NoShim``. ``flush_calls`` reads the shim's counter from inside a
process it is loaded into; ``flush_latency`` times real flushes in a folder.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout: queue_core/lab/speed/ is three levels down
SOURCE = ROOT / "benchmarks" / "slowsync.c"
LIBRARY = ROOT / "build" / "slowsync.so"
DELAY_US = 2000  # the slow-disk regime of make bench: 2 ms per flush


class NoShim(RuntimeError):
    """The slow-disk shim cannot be had here; the message says why."""


def shim_library(build: bool = True, source: Path | None = None, library: Path | None = None,
                 what: str = "the slow-disk shim") -> Path:
    """The built shim, compiled first if it is missing or older than its source
    (the slow disk's, unless another ``source`` and ``library`` are given:
    ``lab.sweeps.checkpoint`` builds its own the same way).

    Raises ``NoShim`` where ``LD_PRELOAD`` does not apply (not Linux), where
    the source is absent (an installed package, not a checkout), or where no
    C compiler exists or the compile fails.
    """
    source = SOURCE if source is None else source  # read when called: a test may move them
    library = LIBRARY if library is None else library
    if not sys.platform.startswith("linux"):
        raise NoShim(f"the shim is loaded with LD_PRELOAD, which this system ({sys.platform}) "
                     "does not read")
    fresh = library.exists() and (not source.exists()
                                  or library.stat().st_mtime >= source.stat().st_mtime)
    if fresh:
        return library
    if not source.exists():
        raise NoShim(f"the shim's source {source.name} is not here (run from a checkout)")
    name = os.environ.get("CC", "cc")
    compiler = shutil.which(name)
    if compiler is None or not build:
        raise NoShim(f"no C compiler ({name}) to build {what}" if compiler is None
                     else f"{library.relative_to(ROOT)} is not built (make bench builds it)")
    # Built under a name of its own, then renamed: two processes that build at
    # once (a notebook and a test run) never load a half-written file.
    partial = library.with_name(f"{library.stem}.{os.getpid()}.partial")
    try:
        library.parent.mkdir(exist_ok=True)
        built = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(partial),
                                str(source), "-ldl"], capture_output=True, text=True, check=False)
        if built.returncode == 0:
            os.replace(partial, library)
            return library
    except OSError as exc:
        raise NoShim(f"the shim cannot be built into {library.parent.name}/: "
                     f"{exc.strerror}") from None
    finally:
        partial.unlink(missing_ok=True)
    said = built.stderr.strip().replace(str(ROOT), ".")  # no absolute path in a notebook
    raise NoShim(f"the C compiler could not build the shim: {said[:200]}")


def shim_env(delay_us: int = DELAY_US, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the shim preloaded
    and ``SLOWSYNC_US`` set; ``delay_us=0`` only counts the flushes."""
    env = dict(os.environ if base is None else base)
    preload = [str(shim_library()), *filter(None, [env.get("LD_PRELOAD")])]
    env["LD_PRELOAD"] = " ".join(preload)
    env["SLOWSYNC_US"] = str(int(delay_us))
    return env


def flush_calls() -> int | None:
    """fsync + fdatasync calls made so far by this process, if the shim is loaded in it."""
    try:
        counter = ctypes.CDLL(None).slowsync_calls
    except AttributeError:
        return None
    counter.restype = ctypes.c_long
    return int(counter())


def flush_latency(folder: str | os.PathLike[str], flushes: int = 25) -> float:
    """Median seconds of one ``fdatasync`` after a small write, on a file in ``folder``."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix="flush-probe-") as probe:
        times = []
        for _ in range(flushes):
            probe.write(b"x" * 512)
            probe.flush()
            started = time.perf_counter()
            os.fdatasync(probe.fileno())
            times.append(time.perf_counter() - started)
    return statistics.median(times)
