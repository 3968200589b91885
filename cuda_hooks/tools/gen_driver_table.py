#!/usr/bin/env python3
"""Writes the X-macro list of every CUDA driver API function, from cuda.h,
and the copy and set hooks of copy_hooks.txt.

Why generated: libphos.so must stand in for every driver entry point a
program can reach (direct linking, dlsym, cuGetProcAddress) so that none
bypasses the gate; the list and the exact prototypes come from the toolkit's
own header, preprocessed twice (legacy and per-thread default stream), so
the versioned names (cuMemAlloc_v2, cuLaunchKernel_ptsz, ...) are the ones
libcuda exports.

Output lines: PHOS_DRIVER_FN(name, (params), (args)); PHOS_DRIVER_HOOKED for
the functions named in HOOKED_LIST (implemented by hand) and those the copy
table's hooks define; PHOS_DRIVER_QUERY for those in QUERY_LIST (queries
handed out unwrapped, see that file).

COPY_OUTPUT: one hook per line of COPY_TABLE and one per per-thread-stream
variant of it that cuda.h declares (_ptds, _ptsz), each with cuda.h's
prototype; copy.cc includes them after the helpers they call (the table's
header says which).
usage: gen_driver_table.py CUDA_INCLUDE_DIR HOOKED_LIST QUERY_LIST COPY_TABLE OUTPUT COPY_OUTPUT -- CC [ARGS...]
(CC ARGS...: the C compiler's whole command, a wrapper such as ccache included)
"""
import os
import re
import subprocess
import sys

DECL = re.compile(r'(?:^|\n)\s*CUresult\s+(cu\w+)\s*\(([^;]*?)\)\s*(?:__attribute__\s*\(\(.*?\)\))?\s*;', re.S)
PER_THREAD = ('_ptds', '_ptsz')


def declarations(cc, include_dir, extra):
    src = subprocess.run([*cc, '-E', '-P', '-x', 'c', *extra, '-I', include_dir, include_dir + '/cuda.h'],
                         check=True, capture_output=True, text=True).stdout
    return DECL.findall(src)


def split_params(params):
    """(type, name) of each parameter."""
    params = ' '.join(params.split())
    if params in ('', 'void'):
        return []
    out = []
    for p in params.split(','):
        m = re.search(r'(\w+)\s*(\[\s*\])?\s*$', p.strip())
        if not m:
            raise SystemExit(f'cannot name parameter {p!r}')
        out.append((p.strip()[:m.start()].strip(), m.group(1)))
    return out


def arg_names(params):
    return [name for _, name in split_params(params)]


def names_in(path):
    return {l.strip() for l in open(path) if l.strip() and not l.startswith('#')}


def call_form(text, where):
    """'form(args)' -> (form, args); the rest of the line after it."""
    m = re.match(r'(\w+)\s*(\(|$|\s)', text)
    if not m:
        raise SystemExit(f'{where}: expected FORM(ARGS) at {text!r}')
    if m.group(2) != '(':
        return (m.group(1), None), text[m.end(1):].strip()
    depth = 0
    for i in range(m.end(1), len(text)):
        depth += {'(': 1, ')': -1}.get(text[i], 0)
        if depth == 0:
            return (m.group(1), text[m.end(1) + 1:i].strip()), text[i + 1:].strip()
    raise SystemExit(f'{where}: unbalanced parentheses')


def copy_table(path):
    """[(name, (record form, args), (host form, args) or None)] in the table's order."""
    rows = []
    for number, line in enumerate(open(path), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        where = f'{path}:{number}'
        name, rest = (line.split(None, 1) + [''])[:2]
        record, rest = call_form(rest.strip(), where)
        host = None
        if rest:
            host, rest = call_form(rest, where)
            if rest or host[1] is None:
                raise SystemExit(f'{where}: expected NAME RECORD [HOST]')
        if record[0] != 'unknown' and record[1] is None:
            raise SystemExit(f'{where}: {record[0]} without arguments')
        rows.append((name, record, host))
    return rows


def copy_hooks(rows, seen):
    """Each hook's name and text; a row's per-thread-stream variants follow it."""
    hooks = []
    for name, (form, args), host in rows:
        if name not in seen:
            raise SystemExit(f'copy table: {name} not in cuda.h')
        for variant in [name] + [name + s for s in PER_THREAD if name + s in seen]:
            params = split_params(seen[variant])
            streams = [n for t, n in params if t == 'CUstream']
            if len(streams) > 1:
                raise SystemExit(f'copy table: {variant} takes two streams')
            stream = streams[0] if streams else 'nullptr'  # a synchronous copy: the default stream
            per_thread = 'true' if variant != name else 'false'
            body = ['  const CopyDeps rt;', f'  GatePass pass(rt.gate(), PHOS_CALL_KIND({variant}));',
                    '  if (gpu_fault::fails()) return CUDA_ERROR_ILLEGAL_ADDRESS;']
            if form == 'unknown':
                body.append(f'  rt.copy_window().before_unknown_call("{variant}");')
            else:
                body.append(f'  if (tracked(rt)) note_{form}(rt, "{variant}", {stream}, {per_thread}, {args});')
            if host:
                body.append(f'  if (window_open(rt)) host_transfer(rt, host_bytes_{host[0]}(rt, {host[1]}));')
            body += [f'  auto real = PHOS_REAL({variant});',
                     f'  return real ? real({", ".join(n for _, n in params)}) : CUDA_ERROR_NOT_FOUND;']
            hooks.append((variant, f'extern "C" PHOS_EXPORT CUresult {variant}({seen[variant]}) {{\n' +
                          '\n'.join(body) + '\n}\n'))
    return hooks


def main():
    if len(sys.argv) < 9 or sys.argv[7] != '--':
        raise SystemExit(__doc__)
    include_dir, hooked_list, query_list, copy_list, output, copy_output = sys.argv[1:7]
    cc = sys.argv[8:]
    hooked, queries = names_in(hooked_list), names_in(query_list)
    seen = {}
    for extra in ([], ['-DCUDA_API_PER_THREAD_DEFAULT_STREAM']):
        for name, params in declarations(cc, include_dir, extra):
            params = ' '.join(params.split()) or 'void'
            if name in seen and seen[name] != params:
                raise SystemExit(f'{name}: two prototypes')
            seen[name] = params
    if len(seen) < 300:
        raise SystemExit(f'only {len(seen)} driver functions found in {include_dir}/cuda.h')
    for what, names in (('hooked', hooked), ('query', queries)):
        missing = names - set(seen)
        if missing:
            raise SystemExit(f'{what} functions not in cuda.h: {sorted(missing)}')
    copies = copy_hooks(copy_table(copy_list), seen)
    copied = {name for name, _ in copies}
    if len(copied) != len(copies):
        raise SystemExit('copy table: a function named twice')
    for what, names in (('hooked', hooked), ('query', queries)):
        if copied & names:
            raise SystemExit(f'functions both in the copy table and {what}: {sorted(copied & names)}')
    if hooked & queries:
        raise SystemExit(f'functions both hooked and queries: {sorted(hooked & queries)}')
    hooked |= copied
    with open(output, 'w') as out:
        out.write('/* Generated by gen_driver_table.py from cuda.h; do not edit. */\n')
        for name in sorted(seen):
            params = seen[name]
            args = ', '.join(arg_names(params))
            macro = 'PHOS_DRIVER_HOOKED' if name in hooked else 'PHOS_DRIVER_QUERY' if name in queries else 'PHOS_DRIVER_FN'
            out.write(f'{macro}({name}, ({params}), ({args}))\n')
    with open(copy_output, 'w') as out:
        out.write(f'// Generated by gen_driver_table.py from {os.path.basename(copy_list)} and cuda.h; do not edit.\n')
        for _, text in copies:
            out.write('\n' + text)


if __name__ == '__main__':
    main()
