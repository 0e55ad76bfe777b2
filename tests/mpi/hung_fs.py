#!/usr/bin/python3
"""A FUSE file system that never answers, as a dead NFS or Lustre server looks
to its clients: its root is an empty directory, and every other request
(the lookup of any name in it) waits for good. Killing this process ends
the waits with ENOTCONN.

usage: hung_fs.py MOUNTPOINT   (stays in the foreground; needs python3-fusepy)
"""
import os
import sys
import threading

from fusepy import FUSE, FuseOSError, Operations  # python3-fusepy


class Hung(Operations):
    def __init__(self):
        self.never = threading.Event()

    def getattr(self, path, fh=None):
        if path == "/":
            return {"st_mode": 0o40700, "st_nlink": 2, "st_uid": os.getuid(), "st_gid": os.getgid()}
        self.never.wait()
        raise FuseOSError(5)

    def readdir(self, path, fh):
        return [".", ".."]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    FUSE(Hung(), sys.argv[1], foreground=True, nothreads=False)
