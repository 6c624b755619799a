//! Every `TRITONSERVER_*`/`TRITONBACKEND_*` function Triton's Python
//! backend calls must be in the server binary's dynamic symbol table: the
//! backend is dlopened with RTLD_NOW, so one missing function and it does
//! not load (or, worse, binds to the copy in the `libtritonserver` it also
//! links). The list is the library's own (`nm -D --undefined-only`), so a
//! newer Python backend is checked against what it really needs.

use std::{collections::BTreeSet, path::Path, process::Command};

fn symbols(args: &[&str], file: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm on {}: {e}", file.display()));
    assert!(
        out.status.success(),
        "nm {args:?} {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|s| s.split('@').next().unwrap_or(s).to_string())
        .filter(|s| s.starts_with("TRITONSERVER_") || s.starts_with("TRITONBACKEND_"))
        .collect()
}

#[test]
fn python_backend_finds_every_function_it_needs_in_the_server() {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".backends/python/libtriton_python.so");
    if !lib.exists() {
        println!(
            "SKIPPED: {} is not installed (scripts/setup.sh installs it)",
            lib.display()
        );
        return;
    }
    let needed = symbols(&["-D", "--undefined-only"], &lib);
    // Triton 2.51's backend needs ~120; an empty list means nm read nothing.
    assert!(
        needed.len() > 50,
        "only {} C API functions found undefined in {}: {needed:?}",
        needed.len(),
        lib.display()
    );
    let server = Path::new(env!("CARGO_BIN_EXE_shardserve"));
    let defined = symbols(&["-D", "--defined-only"], server);
    let missing: Vec<&String> = needed.difference(&defined).collect();
    assert!(
        missing.is_empty(),
        "{} of the {} C API functions the Python backend needs are not exported by {}: {missing:?}",
        missing.len(),
        needed.len(),
        server.display()
    );
}
