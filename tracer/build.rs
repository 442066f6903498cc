//! Builds the eBPF object (`tracer-ebpf`) with aya-build so that it can be embedded in the agent.
use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "tracer-ebpf")
        .ok_or_else(|| anyhow!("tracer-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    // The fuzz targets (the `fuzzing` feature) only parse, never load the object: their
    // sanitizer build skips the nested eBPF build.
    if std::env::var_os("CARGO_FEATURE_FUZZING").is_none() {
        // The BPF target needs `-Z build-std=core`; the stable toolchain allows it only with
        // RUSTC_BOOTSTRAP, which we give to the nested eBPF build alone, not to this workspace.
        // SAFETY: build scripts are single-threaded.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
        aya_build::build_ebpf(
            [aya_build::Package {
                name: ebpf.name.as_str(),
                root_dir: root_dir.as_str(),
                ..Default::default()
            }],
            Toolchain::Custom("stable"),
        )?;
    }
    // With AYA_BUILD_SKIP=1 (lints: `cargo xtask test` runs clippy so) or the `fuzzing`
    // feature nothing was built; an empty object lets the agent compile, and it refuses to
    // load at run time.
    let object = std::path::Path::new(&std::env::var("OUT_DIR")?).join("tracer");
    if !object.exists() {
        std::fs::write(&object, []).with_context(|| format!("writing {}", object.display()))?;
    }
    Ok(())
}
