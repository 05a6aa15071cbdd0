#!/usr/bin/env python3
"""Fails when a source file includes a module its library may not depend on.

The dependency direction (docs/architecture.md): common <- protocol <- channels <- vertex <- ml;
protocol <- jobmanager; cli, tests, bench and fuzz on top of everything. The job manager sees
channels as data and programs as names, so it includes neither; the client binary
(`copse`, the copse_cli_client sources) stays small, so it includes neither vertex nor ml.
Every target includes from the repository root, so only this check stops a header-only
include against the direction (one that the linker, which the libraries' link lines already
restrict, would never see).

Usage: check_dependencies.py REPO_ROOT   (exit 0 when clean, 1 listing each violation)
"""
import pathlib
import re
import sys

# Folder -> the top-level modules its files may include (their own included).
ALLOWED = {
    "common": {"common"},
    "protocol": {"common", "protocol"},
    "channels": {"common", "protocol", "channels"},
    "vertex": {"common", "protocol", "channels", "vertex"},
    "jobmanager": {"common", "protocol", "jobmanager"},
    "ml": {"common", "protocol", "channels", "vertex", "ml"},
}
# The client binary's sources (cli/CMakeLists.txt, copse_cli_client and client_main.cc).
CLIENT_SOURCES = {
    "app_main", "jm_client", "status_view", "job_watch", "process_util", "trace_client", "client_commands", "client_main",
    "commands",
}
CLIENT_ALLOWED = {"common", "protocol", "channels", "jobmanager", "cli"}
MODULES = {"common", "protocol", "channels", "vertex", "jobmanager", "ml", "cli", "bench", "tests", "fuzz"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]*"', re.M)


def allowed_for(path: pathlib.Path):
    top = path.parts[0]
    if top == "cli" and path.stem in CLIENT_SOURCES:
        return CLIENT_ALLOWED, "the client binary (copse_cli_client)"
    if top in ALLOWED:
        return ALLOWED[top], f"copse_{top}"
    return None, None


def main() -> int:
    root = pathlib.Path(sys.argv[1]).resolve()
    violations = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in {".h", ".cc", ".cu"} or not path.is_file():
            continue
        rel = path.relative_to(root)
        if rel.parts[0] not in MODULES:
            continue  # build trees, worktrees
        allowed, who = allowed_for(rel)
        if allowed is None:
            continue
        text = path.read_text(errors="replace")
        for match in INCLUDE.finditer(text):
            module = match.group(1)
            if module in MODULES and module not in allowed:
                line = text.count("\n", 0, match.start()) + 1
                violations.append(f"{rel}:{line}: includes {module}/, which {who} may not depend on "
                                  f"(it may include {', '.join(sorted(allowed))})")
    for v in violations:
        print(v)
    print(f"check_dependencies: {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
