"""Helpers shared by the TensorFlow tests: free loopback ports, the package path."""

import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def free_ports(n):
    """n distinct loopback ports that were free a moment ago."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def cluster(ps, workers):
    """A "ps=...;worker=..." cluster string on fresh loopback ports."""
    ports = free_ports(ps + workers)
    jobs = []
    if ps:
        jobs.append("ps=" + ",".join("127.0.0.1:%d" % p for p in ports[:ps]))
    jobs.append("worker=" + ",".join("127.0.0.1:%d" % p for p in ports[ps:]))
    return ";".join(jobs)


def key(src_task, dst_task, name, frame="0:0", incarnation=0x1234abcd5678ef90):
    """A rendezvous key exactly as Rendezvous::CreateKey writes it."""
    return "/job:worker/replica:0/task:%d/device:CPU:0;%016x;/job:worker/replica:0/task:%d/device:CPU:0;%s;%s" % (
        src_task, incarnation, dst_task, name, frame)
