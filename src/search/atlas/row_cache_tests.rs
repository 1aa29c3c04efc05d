use super::*;
use crate::search::atlas::AtlasStatus;

fn row(status: AtlasStatus) -> AtlasRow {
    AtlasRow {
        config: "a/b.py".into(),
        name: "b".into(),
        family: "a".into(),
        dataset: None,
        miou: None,
        other_metric: None,
        gpu: "rtx3090".into(),
        vram_bytes: 1,
        usable_bytes: 1,
        status,
        batch_size: None,
        crop: None,
        amp: None,
        accumulation: None,
        checkpoint: false,
        num_points: None,
        device_bytes: None,
        images_per_s: None,
        training_hours: None,
        mode: None,
        reason: Some("why".into()),
        unjudged: false,
        seconds: 0.0,
    }
}

#[test]
fn a_damaged_cache_is_kept_aside_and_its_readable_rows_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = RowCache::open(dir.path()).unwrap();
    assert!(cache.note().is_none());
    cache.put("k1".into(), &row(AtlasStatus::Fits)).unwrap();
    let path = dir.path().join("rows.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&[0x9f, 0x00, 0x41, b'\n', 0xff]).unwrap();
    drop(f);
    let cache = RowCache::open(dir.path()).unwrap();
    let note = cache.note().unwrap();
    assert!(
        note.contains("damaged") && note.contains("kept aside"),
        "{note}"
    );
    assert!(cache.get("k1").is_some());
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("rows.jsonl.damaged-")
        })
        .collect();
    assert_eq!(aside.len(), 1);
    // The fresh file reads clean.
    let again = RowCache::open(dir.path()).unwrap();
    assert!(again.note().is_none() && again.get("k1").is_some());
}

#[test]
fn an_edited_row_and_an_older_failed_row_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = RowCache::open(dir.path()).unwrap();
    cache
        .put("k1".into(), &row(AtlasStatus::NothingFits))
        .unwrap();
    let path = dir.path().join("rows.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("nothing_fits", "fits")).unwrap();
    let cache = RowCache::open(dir.path()).unwrap();
    assert!(cache.get("k1").is_none() && cache.note().is_some());
    // An older segtune's failed row (no checksum, not marked judged).
    let old = serde_json::json!({"key": "k2", "row": row(AtlasStatus::Failed)});
    let fits = serde_json::json!({"key": "k3", "row": row(AtlasStatus::Fits)});
    std::fs::write(&path, format!("{old}\n{fits}\n")).unwrap();
    let cache = RowCache::open(dir.path()).unwrap();
    assert!(cache.note().is_none());
    assert!(cache.get("k2").is_none() && cache.get("k3").is_some());
}
