#!/usr/bin/env python3
"""Another user on the node (run as nobody): for SECONDS, every boot socket
(@ucmcache.*) that appears in /proc/net/unix gets three connections: one
sends garbage, one sends a well-formed-looking hello with a forged fd (a
memfd of junk), one says nothing and stays open. Prints how many sockets it
reached. It stops early on SIGTERM (the job it attacks has ended), so a test
waits for the job, not for SECONDS. usage: hostile_attacker.py SECONDS"""
import array, os, signal, socket, sys, time

stopping = False

def stop(signum, frame):
    global stopping
    stopping = True

def names():
    out = set()
    with open("/proc/net/unix") as f:
        for line in f:
            p = line.split()[-1]
            if p.startswith("@ucmcache."):
                out.add(p[1:])
    return out

def attack(name, held):
    addr = "\0" + name
    junk = os.memfd_create("ucmcache-ctrl")
    os.write(junk, b"\xff" * 4096)
    for kind in ("garbage", "fd", "hold"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.setblocking(False)
        try:
            s.connect(addr)
            if kind == "garbage":
                s.send(os.urandom(64))
            elif kind == "fd":
                s.sendmsg([b"\0" * 48], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [junk]))])
        except OSError:
            pass
        held.append(s)

def main():
    until = time.monotonic() + float(sys.argv[1])
    seen, held = set(), []
    signal.signal(signal.SIGTERM, stop)
    while not stopping and time.monotonic() < until:
        for n in names() - seen:
            seen.add(n)
            attack(n, held)
    print("attacker: reached %d boot sockets" % len(seen), flush=True)

main()
