//! The atlas's published results: MMSeg's `metafile.yaml` entries by config
//! name (misnamed entries matched by their name parts), and the dataset a
//! row without a published one is tested on.

use super::{names, AtlasRow};
use crate::config::metafile::{self, Published};
use crate::config::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The published results in the metafile trees `dirs` by config name (the
/// first of a name wins; misnamed entries matched to `configs`, as
/// (root, path) pairs, by [`match_misnamed_entries`]), and the metafiles
/// that could not be read.
pub fn published_results(
    dirs: &[PathBuf],
    configs: &[(PathBuf, PathBuf)],
) -> (BTreeMap<String, Published>, Vec<String>) {
    let mut published: BTreeMap<String, Published> = BTreeMap::new();
    let mut errors = Vec::new();
    for dir in dirs {
        let (found, unread) = metafile::read_tree(dir);
        for (k, v) in found {
            published.entry(k).or_insert(v);
        }
        errors.extend(unread.iter().map(|e| e.to_string()));
    }
    let named: Vec<(String, String)> = configs
        .iter()
        .map(|(root, config)| {
            let (_, name, family) = names(root, config);
            (name, family)
        })
        .collect();
    match_misnamed_entries(&mut published, &named);
    (published, errors)
}

/// The least share of name parts a misnamed metafile entry and a config
/// must have in common to be taken for each other.
const MISNAMED_OVERLAP: f64 = 0.7;

/// Gives a config that no metafile entry names the entry of its directory
/// that names no config, where their names are the same but for a typo or
/// the parts' order (MMSeg 1.2.2's `ddeeplabv3plus_r101-d16-mg124_...`,
/// `eemanet_r50-d8_...`, `fpn_poolformer_s36_8xb4-40k_ade20k-512x512` for
/// `fpn_poolformer_s36_8x4_512x512_40k_ade20k`): the config of the entry's
/// directory sharing the most name parts (`_`/`-`-separated), at least
/// [`MISNAMED_OVERLAP`] of them, and more than any other config there.
/// `configs`: (name, family) of each config.
fn match_misnamed_entries(
    published: &mut BTreeMap<String, Published>,
    configs: &[(String, String)],
) {
    fn parts(name: &str) -> std::collections::BTreeSet<&str> {
        name.split(['_', '-']).filter(|p| !p.is_empty()).collect()
    }
    fn overlap(a: &str, b: &str) -> f64 {
        let (a, b) = (parts(a), parts(b));
        let shared = a.intersection(&b).count();
        shared as f64 / a.union(&b).count().max(1) as f64
    }
    let named: std::collections::HashSet<&str> = configs.iter().map(|(n, _)| n.as_str()).collect();
    let mut claims: BTreeMap<String, Vec<Published>> = BTreeMap::new();
    for (entry, found) in published.iter() {
        if named.contains(entry.as_str()) {
            continue;
        }
        let directory = Path::new(&found.metafile)
            .parent()
            .and_then(Path::file_name)
            .map(|d| d.to_string_lossy().into_owned());
        let mut scored: Vec<(f64, &str)> = configs
            .iter()
            .filter(|(name, family)| {
                Some(family) == directory.as_ref() && !published.contains_key(name)
            })
            .map(|(name, _)| (overlap(entry, name), name.as_str()))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        match scored.as_slice() {
            [(best, name), rest @ ..]
                if *best >= MISNAMED_OVERLAP && rest.first().is_none_or(|r| r.0 < *best) =>
            {
                claims
                    .entry(name.to_string())
                    .or_default()
                    .push(found.clone());
            }
            _ => {}
        }
    }
    // A config two entries would claim gets neither.
    for (name, mut found) in claims {
        if found.len() == 1 {
            published.insert(name, found.remove(0));
        }
    }
}

/// A dataset as a config names it: its MMSeg type and `data_root`.
pub(super) type DatasetKey = (String, String);

/// The dataset a config evaluates on: its `test_dataloader`'s (else
/// `val_dataloader`'s) dataset, through wrappers (`ConcatDataset`'s
/// first, `RepeatDataset`'s), as (type, `data_root`).
pub(super) fn evaluated_on(cfg: &crate::config::Dict) -> Option<DatasetKey> {
    let loader = cfg
        .get("test_dataloader")
        .or_else(|| cfg.get("val_dataloader"))?
        .as_dict()?;
    let mut dataset = loader.get("dataset")?.as_dict()?;
    while dataset.get("data_root").is_none() {
        let inner = dataset.get("dataset").and_then(Value::as_dict).or_else(|| {
            dataset
                .get("datasets")
                .and_then(Value::as_seq)
                .and_then(|list| list.first())
                .and_then(Value::as_dict)
        });
        match inner {
            Some(inner) => dataset = inner,
            None => break,
        }
    }
    let kind = dataset.get("type")?.as_str()?.to_string();
    let root = dataset
        .get("data_root")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((kind, root))
}

/// Gives each row without a published dataset the one its config
/// evaluates on (`keys`, per row): the name the metafiles give most often
/// to the configs on that dataset, else its type without `Dataset`
/// (`PascalContextDataset59`: `PascalContext59`).
pub(super) fn fill_datasets(rows: &mut [AtlasRow], keys: &[Option<DatasetKey>]) {
    let mut names: HashMap<&DatasetKey, BTreeMap<&str, usize>> = HashMap::new();
    for (row, key) in rows.iter().zip(keys) {
        if let (Some(key), Some(name)) = (key, row.dataset.as_deref()) {
            *names.entry(key).or_default().entry(name).or_default() += 1;
        }
    }
    let chosen: HashMap<&DatasetKey, String> = keys
        .iter()
        .flatten()
        .map(|key| {
            let name = names
                .get(key)
                .and_then(|n| n.iter().max_by_key(|(_, count)| **count))
                .map(|(name, _)| name.to_string())
                .unwrap_or_else(|| key.0.replace("Dataset", ""));
            (key, name)
        })
        .collect();
    for (row, key) in rows.iter_mut().zip(keys) {
        if row.dataset.is_none() {
            row.dataset = key.as_ref().and_then(|k| chosen.get(k).cloned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::dump;
    use crate::kinds::GpuChoice;
    use crate::search::atlas::{base_row, budget_of};
    #[test]
    fn a_misnamed_metafile_entry_is_matched_to_its_config_by_its_name_parts() {
        let entry = |metafile: &str, miou: f64| Published {
            dataset: Some("Cityscapes".into()),
            miou: Some(miou),
            other_metric: None,
            memory_gb: None,
            metafile: metafile.into(),
        };
        let mut published: BTreeMap<String, Published> = [
            (
                "eemanet_r50-d8_4xb2-80k_cityscapes-512x1024",
                entry("x/emanet/metafile.yaml", 77.59),
            ),
            (
                "emanet_r101-d8_4xb2-80k_cityscapes-512x1024",
                entry("x/emanet/metafile.yaml", 78.0),
            ),
            (
                "fpn_poolformer_s36_8xb4-40k_ade20k-512x512",
                entry("x/poolformer/metafile.yaml", 41.61),
            ),
            (
                "fpn_poolformer_s24_8xb4-40k_ade20k-512x512",
                entry("x/poolformer/metafile.yaml", 40.0),
            ),
            // Far from every config of its directory: no match.
            (
                "pspnet_r18-d8_4xb2-80k_cityscapes-512x1024",
                entry("x/pspnet/metafile.yaml", 1.0),
            ),
        ]
        .into_iter()
        .map(|(n, p)| (n.to_string(), p))
        .collect();
        let configs: Vec<(String, String)> = [
            ("emanet_r50-d8_4xb2-80k_cityscapes-512x1024", "emanet"),
            ("emanet_r101-d8_4xb2-80k_cityscapes-512x1024", "emanet"),
            ("fpn_poolformer_s36_8x4_512x512_40k_ade20k", "poolformer"),
            ("fpn_poolformer_s24_8xb4-40k_ade20k-512x512", "poolformer"),
            ("pspnet_r50-d8_4xb4-80k_pascal-context-480x480", "pspnet"),
            // Same parts, another directory.
            ("eemanet_r50-d8_4xb2-80k_cityscapes-512x1024x", "other"),
        ]
        .into_iter()
        .map(|(n, f)| (n.to_string(), f.to_string()))
        .collect();
        match_misnamed_entries(&mut published, &configs);
        let miou = |name: &str| published.get(name).and_then(|p| p.miou);
        assert_eq!(
            miou("emanet_r50-d8_4xb2-80k_cityscapes-512x1024"),
            Some(77.59)
        );
        assert_eq!(
            miou("emanet_r101-d8_4xb2-80k_cityscapes-512x1024"),
            Some(78.0)
        );
        assert_eq!(
            miou("fpn_poolformer_s36_8x4_512x512_40k_ade20k"),
            Some(41.61)
        );
        assert_eq!(
            miou("fpn_poolformer_s24_8xb4-40k_ade20k-512x512"),
            Some(40.0)
        );
        assert_eq!(miou("pspnet_r50-d8_4xb4-80k_pascal-context-480x480"), None);
        assert_eq!(miou("eemanet_r50-d8_4xb2-80k_cityscapes-512x1024x"), None);
    }

    #[test]
    fn a_row_without_a_published_dataset_gets_the_one_its_config_evaluates_on() {
        let cfg = |json: serde_json::Value| match dump::from_json(&json) {
            Value::Dict(d) => d,
            _ => unreachable!(),
        };
        // VOC with its augmented set: a ConcatDataset to train, VOC to validate.
        let voc = cfg(serde_json::json!({
            "val_dataloader": {"dataset": {"type": "PascalVOCDataset", "data_root": "data/VOCdevkit/VOC2012"}},
        }));
        let voc_key = (
            "PascalVOCDataset".to_string(),
            "data/VOCdevkit/VOC2012".to_string(),
        );
        assert_eq!(evaluated_on(&voc), Some(voc_key.clone()));
        let repeated = cfg(serde_json::json!({
            "test_dataloader": {"dataset": {"type": "RepeatDataset", "times": 2,
                "dataset": {"type": "ConcatDataset", "datasets": [
                    {"type": "CityscapesDataset", "data_root": "data/cityscapes/"}]}}},
        }));
        let city = (
            "CityscapesDataset".to_string(),
            "data/cityscapes/".to_string(),
        );
        assert_eq!(evaluated_on(&repeated), Some(city.clone()));

        let row = |dataset: Option<&str>| AtlasRow {
            dataset: dataset.map(str::to_string),
            ..base_row(
                &("a.py".into(), "a".into(), "f".into()),
                None,
                &GpuChoice::preset("rtx3050ti"),
                &budget_of(&GpuChoice::preset("rtx3050ti"), None).unwrap(),
            )
        };
        let dark = (
            "DarkZurichDataset".to_string(),
            "data/dark_zurich/".to_string(),
        );
        let mut rows = vec![
            row(Some("Cityscapes")),
            row(None),
            row(Some("Pascal VOC 2012 + Aug")),
            row(None),
            row(None),
            row(None),
        ];
        let keys = [
            Some(city.clone()),
            Some(city),
            Some(voc_key.clone()),
            Some(voc_key),
            Some(dark),
            None,
        ];
        fill_datasets(&mut rows, &keys);
        let names: Vec<Option<&str>> = rows.iter().map(|r| r.dataset.as_deref()).collect();
        assert_eq!(
            names,
            [
                Some("Cityscapes"),
                Some("Cityscapes"),
                Some("Pascal VOC 2012 + Aug"),
                Some("Pascal VOC 2012 + Aug"),
                Some("DarkZurich"),
                None
            ]
        );
    }
}
