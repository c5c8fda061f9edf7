#!/usr/bin/env python3
"""Fails when modules of a crate import each other in a circle.

Usage: scripts/check-import-cycles.py SRC_DIR [SRC_DIR ...]   (e.g. harness/src models/src)

A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`). An edge m -> t is a `crate::`,
`super::` or `self::` path in m (comments and `#[cfg(test)]` modules left out) that names
module t, or a parent m naming its child `c::...`. Prints every cycle and exits 1 if any.
"""
import re, os, sys


def cycles_in(root):
    def mod_of(path):
        rel = os.path.relpath(path, root)[:-3].split('/')
        if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
        return tuple(rel)
    files = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(d, f); files[mod_of(p)] = p
    mods = set(files)
    def resolve(cur, path):
        parts = path.split('::')
        if parts[0] == 'crate': base = (); parts = parts[1:]
        elif parts[0] == 'super':
            base = cur[:-1]; parts = parts[1:]
            while parts and parts[0] == 'super': base = base[:-1]; parts = parts[1:]
        elif parts[0] == 'self': base = cur; parts = parts[1:]
        else: return None
        best = None
        m = base
        if m in mods: best = m
        for p in parts:
            p = p.strip('{} ')
            if not p: break
            m = m + (p,)
            if m in mods: best = m
            else: break
        return best
    edges = {m: set() for m in mods}
    for m, p in files.items():
        text = open(p).read()
        # strip test modules
        text = re.split(r'#\[cfg\(test\)\]', text)[0]
        text = re.sub(r'//[^\n]*', '', text)
        for mm in re.finditer(r'\b((?:crate|super|self)(?:::\{?[A-Za-z_][A-Za-z0-9_]*)+)', text):
            t = resolve(m, mm.group(1).replace('{', ''))
            if t is not None and t != m and t != () and not (len(t) < len(m) and m[:len(t)] == t and False):
                edges[m].add(t)
        for c in mods:
            if len(c) == len(m) + 1 and c[:len(m)] == m:
                if re.search(r'(?<![:\w])%s::' % c[-1], text):
                    edges[m].add(c)
    # parent mod declaring child isn't an import; ignore edges from child to ancestor declared mod? keep
    def cycles():
        out = []
        color = {}
        stack = []
        def dfs(u):
            color[u] = 1; stack.append(u)
            for v in edges[u]:
                if color.get(v) == 1:
                    out.append(stack[stack.index(v):] + [v])
                elif v not in color:
                    dfs(v)
            stack.pop(); color[u] = 2
        for m in sorted(mods):
            if m not in color: dfs(m)
        return out
    cs = cycles()
    return [' -> '.join('::'.join(x) or 'crate' for x in c) for c in cs]


if __name__ == "__main__":
    found = 0
    for root in sys.argv[1:]:
        for c in cycles_in(root):
            print(f"{root}: {c}")
            found += 1
    print(f"import cycles: {found} in {len(sys.argv) - 1} source folders")
    sys.exit(1 if found else 0)
