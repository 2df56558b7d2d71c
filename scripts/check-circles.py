#!/usr/bin/env python3
"""No circle of calls between the files of one folder (docs/ARCHITECTURE.md,
"Dependency order"). For each folder given, reads its compiled objects in
BUILD/obj/<folder>/: file A needs file B when A's object leaves a symbol
undefined that B's defines. Prints every set of files that need each
other round (a strongly connected set), with its edges, and exits 1 if
there is one.

Usage: check-circles.py BUILD FOLDER...
"""
import os
import subprocess
import sys


def needs(objdir):
    defs, undef = {}, {}
    for name in sorted(os.listdir(objdir)):
        if not name.endswith(".o"):
            continue
        f = name[:-2]
        out = subprocess.run(["nm", os.path.join(objdir, name)], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBR":
                defs[p[2]] = f
            elif len(p) == 2 and p[0] == "U":
                undef.setdefault(f, set()).add(p[1])
    graph = {}
    for f, syms in undef.items():
        for s in syms:
            if s in defs and defs[s] != f:
                graph.setdefault(f, set()).add(defs[s])
    return graph


def circles(graph):
    """Tarjan's strongly connected components of more than one file."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    build, bad = sys.argv[1], False
    for folder in sys.argv[2:]:
        objdir = os.path.join(build, "obj", folder)
        if not os.path.isdir(objdir):
            continue
        graph = needs(objdir)
        for comp in circles(graph):
            bad = True
            print(f"circles: {folder}/ files need each other round: {', '.join(comp)}",
                  file=sys.stderr)
            for a in comp:
                for b in sorted(graph.get(a, ())):
                    if b in comp:
                        print(f"  {folder}/{a}.c -> {folder}/{b}.c", file=sys.stderr)
    if not bad:
        print(f"circles: none inside {', '.join(f + '/' for f in sys.argv[2:])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
