#!/usr/bin/env python3
"""Writes the hwloc XML topologies under tests/fixtures/hwloc/ (hwloc 2.x
format, as `lstopo file.xml` records a machine), for the placement tests.

Written by hand after the layouts of real machines, not captured from them:
- h100-x1-16core.xml: the nvidia-h100-x1 class VM (one socket, 16 cores
  without SMT, one NUMA node, one H100 SXM behind a virtual bridge);
- dual-socket-4gpu.xml: a dual-socket server (2 x 16 cores with SMT,
  Linux numbering: PUs 0-15 and 32-47 on socket 0), one NUMA node per
  socket, two H100 PCIe per socket and a ConnectX NIC on socket 0.
Usage: scripts/gen_hwloc_fixtures.py [--check]
"""
import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hwloc"


def bitmap(bits):
    """hwloc bitmap text: 32-bit words, most significant first."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if value == 0:
            break
    return ",".join(f"0x{w:08x}" for w in reversed(words))


class Writer:
    def __init__(self):
        self.lines = []
        self.gp = 0

    def gp_index(self):
        self.gp += 1
        return self.gp

    def open(self, depth, attrs, close=False):
        text = " ".join(f'{k}="{v}"' for k, v in attrs)
        self.lines.append("  " * depth + f"<object {text}{'/' if close else ''}>")

    def close(self, depth):
        self.lines.append("  " * depth + "</object>")

    def info(self, depth, name, value):
        self.lines.append("  " * depth + f'<info name="{name}" value="{value}"/>')


def sets(cpus, nodes):
    return [
        ("cpuset", bitmap(cpus)),
        ("complete_cpuset", bitmap(cpus)),
        ("nodeset", bitmap(nodes)),
        ("complete_nodeset", bitmap(nodes)),
    ]


def pci_dev(w, depth, busid, cls, vendor, device, sub, name, osdev=None):
    w.open(depth, [("type", "PCIDev"), ("gp_index", w.gp_index()), ("pci_busid", busid),
                   ("pci_type", f"{cls} [{vendor}:{device}] [{sub}] a1"),
                   ("pci_link_speed", "31.507692")])
    w.info(depth + 1, "PCIVendor", name[0])
    w.info(depth + 1, "PCIDevice", name[1])
    if osdev:
        w.open(depth + 1, [("type", "OSDev"), ("gp_index", w.gp_index()), ("name", osdev[0]),
                           ("subtype", osdev[1]), ("osdev_type", osdev[2])])
        for k, v in osdev[3]:
            w.info(depth + 2, k, v)
        w.close(depth + 1)
    w.close(depth)


def bridge(w, depth, busid, lo, hi, children):
    w.open(depth, [("type", "Bridge"), ("gp_index", w.gp_index()), ("bridge_type", "1-1"),
                   ("depth", "1"), ("bridge_pci", f"0000:[{lo}-{hi}]"), ("pci_busid", busid),
                   ("pci_type", "0604 [8086:352a] [0000:0000] 04"), ("pci_link_speed", "31.507692")])
    for child in children:
        child(depth + 1)
    w.close(depth)


def host_bridge(w, depth, lo, hi, children):
    w.open(depth, [("type", "Bridge"), ("gp_index", w.gp_index()), ("bridge_type", "0-1"),
                   ("depth", "0"), ("bridge_pci", f"0000:[{lo}-{hi}]")])
    for child in children:
        child(depth + 1)
    w.close(depth)


def gpu(w, busid, index, model, device):
    uuid = f"GPU-5e1f0000-0000-4000-8000-{index:012x}"
    return lambda d: pci_dev(w, d, busid, "0302", "10de", device, "10de:16c1",
                             ("NVIDIA Corporation", model),
                             (f"cuda{index}", "CUDA", "5",
                              [("Backend", "CUDA"), ("GPUVendor", "NVIDIA Corporation"),
                               ("GPUModel", model), ("CUDAGlobalMemorySize", "83886080")]))


def package(w, depth, os_index, node, cores, node_bytes, io):
    """cores: list of (core os_index, [PU ids])."""
    cpus = [pu for _, pus in cores for pu in pus]
    w.open(depth, [("type", "Package"), ("os_index", os_index)] + sets(cpus, [node]) +
           [("gp_index", w.gp_index())])
    w.info(depth + 1, "CPUVendor", "GenuineIntel")
    w.open(depth + 1, [("type", "NUMANode"), ("os_index", node)] + sets(cpus, [node]) +
           [("gp_index", w.gp_index()), ("local_memory", node_bytes)])
    w.lines.append("  " * (depth + 2) + f'<page_type size="4096" count="{node_bytes // 4096}"/>')
    w.close(depth + 1)
    for core, pus in cores:
        w.open(depth + 1, [("type", "Core"), ("os_index", core)] + sets(pus, [node]) +
               [("gp_index", w.gp_index())])
        for pu in pus:
            w.open(depth + 2, [("type", "PU"), ("os_index", pu)] + sets([pu], [node]) +
                   [("gp_index", w.gp_index())], close=True)
        w.close(depth + 1)
    for child in io:
        child(depth + 1)
    w.close(depth)


def document(build, cpus, nodes, product):
    w = Writer()
    w.lines += ['<?xml version="1.0" encoding="UTF-8"?>',
                '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
                '<topology version="2.0">']
    w.open(1, [("type", "Machine"), ("os_index", 0)] + sets(cpus, nodes) +
           [("allowed_cpuset", bitmap(cpus)), ("allowed_nodeset", bitmap(nodes)),
            ("gp_index", w.gp_index())])
    w.info(2, "DMIProductName", product)
    w.info(2, "Backend", "Linux")
    w.info(2, "OSName", "Linux")
    w.info(2, "Architecture", "x86_64")
    w.info(2, "hwlocVersion", "2.9.0")
    build(w)
    w.close(1)
    w.lines.append("</topology>")
    return "\n".join(w.lines) + "\n"


def h100_x1():
    cpus = list(range(16))

    def build(w):
        package(w, 2, 0, 0, [(c, [c]) for c in cpus], 128 * 2**30, [])
        # A VM's PCI tree hangs off the machine; with one NUMA node the
        # device is still local to node 0.
        host_bridge(w, 2, "00", "00", [gpu(w, "0000:00:05.0", 0, "NVIDIA H100 80GB HBM3", "2330")])

    return document(build, cpus, [0], "nvidia-h100-x1 (16 vCPU, 1x H100 SXM)")


def dual_socket():
    cpus = list(range(64))

    def socket_cores(s):
        return [(c, [c, c + 32]) for c in range(16 * s, 16 * s + 16)]

    def build(w):
        nic = lambda d: pci_dev(w, d, "0000:18:00.0", "0200", "15b3", "1021", "15b3:0041",
                                ("Mellanox Technologies", "MT2910 ConnectX-7"),
                                ("ibp24s0", "OpenFabrics", "3", [("Backend", "Linux")]))
        io0 = [lambda d: host_bridge(w, d, "15", "31", [
            lambda d: bridge(w, d, "0000:15:01.0", "17", "18",
                             [gpu(w, "0000:17:00.0", 0, "NVIDIA H100 PCIe", "2331"), nic]),
            lambda d: bridge(w, d, "0000:15:02.0", "31", "31",
                             [gpu(w, "0000:31:00.0", 1, "NVIDIA H100 PCIe", "2331")]),
        ])]
        io1 = [lambda d: host_bridge(w, d, "b0", "ca", [
            lambda d: bridge(w, d, "0000:b0:01.0", "b1", "b1",
                             [gpu(w, "0000:b1:00.0", 2, "NVIDIA H100 PCIe", "2331")]),
            lambda d: bridge(w, d, "0000:b0:02.0", "ca", "ca",
                             [gpu(w, "0000:ca:00.0", 3, "NVIDIA H100 PCIe", "2331")]),
        ])]
        package(w, 2, 0, 0, socket_cores(0), 256 * 2**30, io0)
        package(w, 2, 1, 1, socket_cores(1), 256 * 2**30, io1)

    return document(build, cpus, [0, 1], "dual-socket 2x16 cores, 4x H100 PCIe")


FILES = {"h100-x1-16core.xml": h100_x1, "dual-socket-4gpu.xml": dual_socket}

if __name__ == "__main__":
    check = "--check" in sys.argv
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, make in FILES.items():
        text = make()
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        sys.exit(f"stale fixtures: {stale} (run scripts/gen_hwloc_fixtures.py)")
