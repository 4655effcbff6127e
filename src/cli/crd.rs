//! `bulkhead crd`: print, write or check the generated CustomResourceDefinitions.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::api::{all_crds, crd_yaml};

/// `bulkhead crd` options.
#[derive(clap::Args, Debug)]
pub struct CrdOptions {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long, conflicts_with = "check")]
    pub output_dir: Option<PathBuf>,
    /// Compare the files in this directory with the generated CRDs and fail on any
    /// difference (used by `make test` to catch drift).
    #[arg(long)]
    pub check: Option<PathBuf>,
}

/// Runs `bulkhead crd`.
pub fn run(options: &CrdOptions) -> anyhow::Result<()> {
    let crds = all_crds();
    if let Some(dir) = &options.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (file, crd) in &crds {
            let path = dir.join(file);
            std::fs::write(&path, crd_yaml(crd))
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    } else if let Some(dir) = &options.check {
        let drifted: Vec<String> = crds
            .iter()
            .filter(|(file, crd)| {
                std::fs::read_to_string(dir.join(file)).ok() != Some(crd_yaml(crd))
            })
            .map(|(file, _)| dir.join(file).display().to_string())
            .collect();
        if !drifted.is_empty() {
            bail!(
                "generated CRDs differ from the committed files: {}; run `make crds` and commit the result",
                drifted.join(", ")
            );
        }
        eprintln!("{} CRDs in {} match the code", crds.len(), dir.display());
    } else {
        let documents: Vec<String> = crds.iter().map(|(_, crd)| crd_yaml(crd)).collect();
        print!("{}", documents.join("---\n"));
    }
    Ok(())
}
