"""A filesystem that keeps only what was fsynced, for power-loss tests (as Jepsen's LazyFS).

`python lazyfs.py BACKING MOUNTPOINT` mounts BACKING at MOUNTPOINT (FUSE, in the foreground).
Data written to a file is held in this process's memory, as a page cache holds it, until the
file is fsynced: then it goes to BACKING and BACKING is fsynced. Killing this process with
SIGKILL is the power cut: whatever was not fsynced is gone, and mounting BACKING again shows
what a machine would find after a reboot.

Simplifications, each on the side of losing less than a real disk might: names (create,
rename, unlink, mkdir) and truncation go to BACKING at once, as a journaling filesystem
commits metadata; a write is lost whole or kept whole, never torn within itself.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import mfusepy

STAT_FIELDS = (
    "st_mode",
    "st_nlink",
    "st_uid",
    "st_gid",
    "st_size",
    "st_atime",
    "st_mtime",
    "st_ctime",
)
STATVFS_FIELDS = (
    "f_bsize",
    "f_frsize",
    "f_blocks",
    "f_bfree",
    "f_bavail",
    "f_files",
    "f_ffree",
    "f_favail",
    "f_flag",
    "f_namemax",
)


@dataclass
class Unsynced:
    """A file's writes since its last fsync, in the order they were made, over BACKING."""

    size: int
    writes: list[tuple[int, bytearray]] = field(default_factory=list)

    def write(self, offset: int, data: bytes) -> None:
        last = self.writes[-1] if self.writes else None
        if last is not None and last[0] + len(last[1]) == offset:
            last[1].extend(data)  # Appends, the common case, stay one extent.
        else:
            self.writes.append((offset, bytearray(data)))
        self.size = max(self.size, offset + len(data))

    def read_over(self, backing: bytes, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        if end <= offset:
            return b""
        view = bytearray(backing[: end - offset].ljust(end - offset, b"\0"))
        for start, data in self.writes:
            low, high = max(start, offset), min(start + len(data), end)
            if low < high:
                view[low - offset : high - offset] = data[low - start : high - start]
        return bytes(view)

    def truncate(self, length: int) -> None:
        self.size = length
        self.writes = [
            (start, data[: length - start]) for start, data in self.writes if start < length
        ]


class LazyFS(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True
    """Times as integer nanoseconds, as `os.utime(ns=...)` takes them."""

    def __init__(self, backing: str) -> None:
        self.backing = os.path.abspath(backing)
        self.unsynced: dict[str, Unsynced] = {}
        self._guard = threading.Lock()

    def _full(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._guard:
            info = os.lstat(self._full(path))
            attributes = {name: getattr(info, name) for name in STAT_FIELDS}
            if (pending := self.unsynced.get(path)) is not None:
                attributes["st_size"] = pending.size
            return attributes

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def statfs(self, path: str) -> dict[str, int]:
        info = os.statvfs(self._full(path))
        return {name: getattr(info, name) for name in STATVFS_FIELDS}

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._full(path))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._full(path), ns=times)
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return os.open(self._full(path), os.O_RDWR | os.O_CREAT, mode)

    def open(self, path: str, flags: int) -> int:
        # Offsets come from the kernel; the backing file is only ever written at them.
        return os.open(self._full(path), flags & ~os.O_APPEND)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def unlink(self, path: str) -> int:
        with self._guard:
            os.unlink(self._full(path))
            self.unsynced.pop(path, None)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._guard:
            os.rename(self._full(old), self._full(new))
            for name in list(self.unsynced):
                if name == old or name.startswith(old + "/"):
                    self.unsynced[new + name[len(old) :]] = self.unsynced.pop(name)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._guard:
            backing = os.pread(fh, size, offset)
            pending = self.unsynced.get(path)
            return backing if pending is None else pending.read_over(backing, offset, size)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._guard:
            pending = self.unsynced.get(path)
            if pending is None:
                pending = self.unsynced[path] = Unsynced(size=os.fstat(fh).st_size)
            pending.write(offset, data)
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._guard:
            os.truncate(self._full(path), length)
            if (pending := self.unsynced.get(path)) is not None:
                pending.truncate(length)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._guard:
            pending = self.unsynced.pop(path, None)
            descriptor = os.open(self._full(path), os.O_WRONLY)
            try:
                for offset, data in pending.writes if pending is not None else ():
                    os.pwrite(descriptor, data, offset)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() flushes nothing to disk: only fsync does.


def main(backing: str, mountpoint: str) -> None:
    mfusepy.FUSE(LazyFS(backing), os.path.abspath(mountpoint), foreground=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
