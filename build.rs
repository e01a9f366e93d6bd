//! Release builds of the binaries on x86_64 Linux place the functions vaultd runs from start-up
//! through its first note together (`scripts/symbol-order.txt`, made by
//! `scripts/symbol-order`). A daemon keeps every code page it touched, and the kernel maps the
//! 64 KiB around each first touch: start-up code scattered over the binary kept ~9 MiB of it
//! resident where ~3 MiB runs (idle RSS 14.9 → 9.6 MiB, BENCHMARKS.md). It takes LLD, rustc's
//! linker on that target since 1.90; `VAULTD_SYMBOL_ORDER=0` leaves it out (another linker).
//! Such builds also pack their relative relocations where glibc can read them (see `main`).

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=scripts/symbol-order.txt");
    println!("cargo:rerun-if-env-changed=VAULTD_SYMBOL_ORDER");
    println!("cargo:rerun-if-env-changed=VAULTD_PACK_RELOCS");
    let wanted = env::var("VAULTD_SYMBOL_ORDER").map_or(true, |v| v != "0");
    let release = env::var("PROFILE").as_deref() == Ok("release");
    let target = env::var("TARGET").unwrap_or_default();
    if !(release && target == "x86_64-unknown-linux-gnu" && links_with_lld()) {
        return;
    }
    // Relative relocations packed (DT_RELR): `.rela.dyn` shrinks from ~880 KB, which the
    // dynamic loader reads whole at every start and which then stays resident, to a few KB
    // (idle RSS, BENCHMARKS.md). The loader must know DT_RELR: glibc 2.36 or later, which is
    // also what the binary then asks for (`GLIBC_ABI_DT_RELR`), so only where the build
    // machine's glibc has it. `VAULTD_PACK_RELOCS=0` leaves it out: a binary built here to
    // run on an older glibc (Debian 11, RHEL 9).
    let pack = env::var("VAULTD_PACK_RELOCS").map_or(true, |v| v != "0");
    if pack && glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if !wanted {
        return;
    }
    let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let order = Path::new(&dir).join("scripts/symbol-order.txt");
    if !order.is_file() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // Functions of the list that this build does not have (renamed, gone) are skipped.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// Whether rustc links with LLD: its default on x86_64 Linux from 1.90, unless the flags name
/// another linker.
fn links_with_lld() -> bool {
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker") {
        return false;
    }
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let Ok(out) = Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 90)
}

/// Whether the build machine's glibc (what `ldd --version` names: "ldd (Debian GLIBC 2.36-9)
/// 2.36") is at least `major.minor`.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("ldd").arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    if !first.contains("GLIBC") && !first.contains("GNU libc") {
        return false;
    }
    let Some(version) = first.split_whitespace().last() else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(ma), Some(mi)) => (ma, mi) >= (major, minor),
        _ => false,
    }
}
