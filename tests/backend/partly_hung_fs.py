#!/usr/bin/python3
"""A FUSE file system over a real directory whose server stops answering for
some files, as the clients of a Lustre file system see it when the server of
some of its files dies: every call passes through to BACKING, except reads of
the files named on the command line below byte HANG_BELOW (a posix store's
shard bytes; its header index, after them, still reads), which wait for good.
Killing this process ends those waits (the kernel answers ENOTCONN).

Mounted with direct_io, so that every read reaches this server, none answered
from the page cache (the kernel runs such a read in the caller's thread, an
io_uring read too); with CACHE=page, through the page cache (a read that
misses it is a page-cache fill, which io_uring hands to its own workers).

usage: partly_hung_fs.py BACKING MOUNTPOINT HANG_BELOW CACHE NAME...
       CACHE: direct or page  (stays in the foreground; needs python3-fusepy)
"""
import errno
import os
import sys
import threading

from fusepy import FUSE, FuseOSError, Operations  # python3-fusepy


class PartlyHung(Operations):
    def __init__(self, backing, hang_below, names):
        self.backing = backing
        self.hang_below = hang_below
        self.names = set(names)
        self.never = threading.Event()

    def _path(self, path):
        return os.path.join(self.backing, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._path(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def open(self, path, flags):
        try:
            return os.open(self._path(path), flags & ~(os.O_DIRECT | os.O_NONBLOCK))
        except OSError as e:
            raise FuseOSError(e.errno)

    def create(self, path, mode, fi=None):
        try:
            return os.open(self._path(path), os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
        except OSError as e:
            raise FuseOSError(e.errno)

    def read(self, path, size, offset, fh):
        if os.path.basename(path) in self.names and offset < self.hang_below:
            self.never.wait()
            raise FuseOSError(errno.EIO)
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        os.truncate(self._path(path), length)

    def unlink(self, path):
        os.unlink(self._path(path))

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)

    def fsync(self, path, datasync, fh):
        os.fsync(fh)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        os.close(fh)


if __name__ == "__main__":
    if len(sys.argv) < 6 or sys.argv[4] not in ("direct", "page"):
        sys.exit(__doc__)
    backing, mnt, below, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    FUSE(PartlyHung(backing, below, sys.argv[5:]), mnt, foreground=True, nothreads=False,
         direct_io=(cache == "direct"))
