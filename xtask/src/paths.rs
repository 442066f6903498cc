//! Where things live: the workspace, its target directory and the VM cache under it.
use std::path::PathBuf;
use std::process::Command;

/// The workspace root (the parent of this crate).
pub fn root() -> PathBuf {
    let xtask = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    xtask
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// Cargo's target directory, honouring `CARGO_TARGET_DIR`.
pub fn target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// Everything the VM tasks download or generate: kernels, apt lists, initramfs, console logs.
pub fn vm() -> PathBuf {
    target().join("vm")
}

/// The cargo that runs this xtask, in the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}
