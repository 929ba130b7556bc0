// Shared by the build.rs of every package that links tch (included with `include!`).
//
// tch links libtorch with `--as-needed`, so a binary whose code never names a
// CUDA symbol drops libtorch_cuda.so and CUDA silently stays unavailable. We
// force-link libtorch (and libtorch_cuda when present) and set an rpath to the
// libtorch directory so binaries run without LD_LIBRARY_PATH.

fn libtorch_lib_dir() -> Option<std::path::PathBuf> {
    if let Ok(dir) = std::env::var("LIBTORCH") {
        return Some(std::path::Path::new(&dir).join("lib"));
    }
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python3".to_string());
    let out = std::process::Command::new(&python)
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__))"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?;
    Some(std::path::Path::new(dir.trim()).join("lib"))
}

fn link_libtorch() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PYTHON_SYS_EXECUTABLE");
    let Some(lib) = libtorch_lib_dir() else {
        println!("cargo:warning=libtorch not found (set LIBTORCH or PYTHON_SYS_EXECUTABLE; see scripts/env.sh)");
        return;
    };
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-ltorch_cpu");
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-ltorch_cuda");
    }
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}
