//! Tests of the atlas: its lock, and which failures are judgements.

use super::*;

#[test]
fn configs_are_found_below_the_directories_without_bases() {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "pspnet/pspnet_r18.py",
        "pspnet/_helper.py",
        "_base_/models/pspnet_r50-d8.py",
        ".git/x.py",
        "segformer/b0.rhai",
        "segformer/README.md",
    ] {
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "x = 1\n").unwrap();
    }
    let found: Vec<String> = configs_under(&[dir.path().to_path_buf()])
        .into_iter()
        .map(|(root, c)| names(&root, &c).0)
        .collect();
    assert_eq!(found, vec!["pspnet/pspnet_r18.py", "segformer/b0.rhai"]);
    let (relative, stem, family) = names(dir.path(), &dir.path().join("pspnet/pspnet_r18.py"));
    assert_eq!(
        (relative.as_str(), stem.as_str(), family.as_str()),
        ("pspnet/pspnet_r18.py", "pspnet_r18", "pspnet")
    );
}

#[test]
fn gpus_are_labelled_by_preset_or_size() {
    assert_eq!(GpuChoice::preset("rtx3090").label(), "rtx3090");
    let vram = GpuChoice::custom("6G".parse().unwrap(), None);
    assert_eq!(vram.label(), "vram-6G");
    assert!(budget_of(&vram, None).unwrap().vram_bytes == 6 << 30);
}

#[test]
fn a_second_atlas_on_one_out_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let first = lock_out(dir.path()).unwrap();
    let err = lock_out(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("another segtune atlas")
            && err.contains(&format!("process {}", std::process::id()))
            && err.contains("give another --out"),
        "{err}"
    );
    drop(first);
    assert!(lock_out(dir.path()).is_ok());
}

#[test]
fn only_judgements_are_kept() {
    use crate::trial::TrialStatus;
    assert!(is_judgement(&Error::Input(
        "--amp bf16: the rtx2070 has compute capability 7.5".into()
    )));
    assert!(!is_judgement(&Error::Input(format!(
        "{} /o (it holds /o/.segtune.lock)",
        crate::search::journal::ANOTHER_SEARCH
    ))));
    assert!(!is_judgement(&Error::Trial(
        "the inspection failed: killed by SIGKILL".into()
    )));
    assert!(!is_judgement(&Error::environment(
        "no candidate could be judged"
    )));
    assert!(!is_judgement(&Error::Unanswered {
        status: TrialStatus::HostOom,
        message: "out of the host's memory".into(),
    }));
}
