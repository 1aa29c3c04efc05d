//! MMSeg's model-zoo `metafile.yaml` files: the published result of each
//! config (dataset, mIoU) and the training memory the zoo measured. They sit
//! next to the configs in a checkout (`configs/<method>/metafile.yaml`) and
//! in the installed package (`mmseg/.mim/configs/<method>/metafile.yaml`).
//! Each lists `Models`, each with a `Name` (the config's file stem),
//! `Config` (its path), `Results` (one mapping or a list of them: `Task`,
//! `Dataset`, `Metrics: {mIoU: 37.41, mIoU(ms+flip): 38.34}`) and
//! `Metadata` (`Memory (GB)`, `Batch Size`, `Training Resources`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

/// One config's published result.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Published {
    /// The dataset of the result (`ADE20K`, `Cityscapes`, ...).
    pub dataset: Option<String>,
    /// Single-scale mIoU, as the metafile gives it (percent).
    pub miou: Option<f64>,
    /// Without an mIoU, the result's first metric as the metafile names it
    /// (`mDice 88.92` for the medical sets, `RMSE 0.258` for depth).
    pub other_metric: Option<String>,
    /// The zoo's training memory per GPU, GB.
    pub memory_gb: Option<f64>,
    /// The metafile it came from.
    pub metafile: String,
}

/// A metafile that could not be read: the file and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {why}")]
pub struct MetafileError {
    pub path: PathBuf,
    pub why: String,
}

/// Every `metafile.yaml` under `dir` (recursively), read: the published
/// results by config stem, and the files that could not be read (a broken
/// metafile is skipped and named, never the end of the atlas).
pub fn read_tree(dir: &Path) -> (BTreeMap<String, Published>, Vec<MetafileError>) {
    let mut found = BTreeMap::new();
    let mut errors = Vec::new();
    let mut files = Vec::new();
    collect(dir, &mut files);
    files.sort();
    for path in files {
        match read_file(&path) {
            Ok(models) => {
                for (name, published) in models {
                    found.entry(name).or_insert(published);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    (found, errors)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => collect(&path, out),
            Ok(t) if t.is_file() && entry.file_name() == "metafile.yaml" => out.push(path),
            _ => {}
        }
    }
}

/// The models of one metafile: (config stem, its published result).
pub fn read_file(path: &Path) -> Result<Vec<(String, Published)>, MetafileError> {
    let err = |why: String| MetafileError {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    parse(&text, &path.display().to_string()).map_err(err)
}

/// The models of a metafile's text (`source` names it in each result).
pub fn parse(text: &str, source: &str) -> Result<Vec<(String, Published)>, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    let Some(doc) = docs.first() else {
        return Ok(Vec::new());
    };
    let Some(models) = doc["Models"].as_vec() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for model in models {
        let name = model["Name"].as_str().map(str::to_string).or_else(|| {
            model["Config"]
                .as_str()
                .and_then(|c| Path::new(c).file_stem())
                .map(|s| s.to_string_lossy().into_owned())
        });
        let Some(name) = name else {
            continue;
        };
        let results: Vec<&Yaml> = match &model["Results"] {
            Yaml::Array(list) => list.iter().collect(),
            Yaml::Hash(_) => vec![&model["Results"]],
            _ => Vec::new(),
        };
        // The semantic-segmentation result with an mIoU, else the first.
        let result = results
            .iter()
            .find(|r| number(&r["Metrics"]["mIoU"]).is_some())
            .or(results.first());
        out.push((
            name,
            Published {
                // Some MMSeg metafiles quote a YAML comment as the dataset
                // (`Dataset: '# HRNet backbone'`): no dataset.
                dataset: result
                    .and_then(|r| r["Dataset"].as_str())
                    .filter(|d| !d.trim_start().starts_with('#'))
                    .map(str::to_string),
                miou: result.and_then(|r| number(&r["Metrics"]["mIoU"])),
                other_metric: result
                    .filter(|r| number(&r["Metrics"]["mIoU"]).is_none())
                    .and_then(|r| r["Metrics"].as_hash())
                    .and_then(|h| h.iter().next())
                    .and_then(|(k, v)| Some(format!("{} {}", k.as_str()?, number(v)?))),
                memory_gb: number(&model["Metadata"]["Memory (GB)"]),
                metafile: source.to_string(),
            },
        ));
    }
    Ok(out)
}

fn number(y: &Yaml) -> Option<f64> {
    match y {
        Yaml::Real(_) => y.as_f64(),
        Yaml::Integer(i) => Some(*i as f64),
        Yaml::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGFORMER: &str = "Collections:\n- Name: Segformer\n  Metadata:\n    Training Data:\n    - ADE20K\nModels:\n- Name: segformer_mit-b0_8xb2-160k_ade20k-512x512\n  In Collection: Segformer\n  Results:\n    Task: Semantic Segmentation\n    Dataset: ADE20K\n    Metrics:\n      mIoU: 37.41\n      mIoU(ms+flip): 38.34\n  Config: configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py\n  Metadata:\n    Batch Size: 16\n    Memory (GB): 2.1\n- Name: two-results\n  Results:\n  - Task: Semantic Segmentation\n    Dataset: Cityscapes\n    Metrics:\n      aAcc: 95.1\n  - Task: Semantic Segmentation\n    Dataset: Cityscapes\n    Metrics:\n      mIoU: 80\n  Config: configs/x/two-results.py\n- Config: configs/x/no-name.py\n  Results: {}\n";

    #[test]
    fn a_metafile_gives_each_config_its_dataset_miou_and_memory() {
        let models = parse(SEGFORMER, "segformer/metafile.yaml").unwrap();
        assert_eq!(models.len(), 3);
        let (name, b0) = &models[0];
        assert_eq!(name, "segformer_mit-b0_8xb2-160k_ade20k-512x512");
        assert_eq!(b0.dataset.as_deref(), Some("ADE20K"));
        assert_eq!(b0.miou, Some(37.41));
        assert_eq!(b0.memory_gb, Some(2.1));
        // A list of results: the one with an mIoU (an integer reads too).
        assert_eq!(models[1].1.miou, Some(80.0));
        // No name: the config's stem; no result: none, said as such.
        assert_eq!(models[2].0, "no-name");
        assert_eq!(models[2].1.miou, None);
        assert_eq!(models[2].1.other_metric, None);
        let dice = "Models:\n- Name: unet\n  Results:\n    Dataset: HRF\n    Metrics:\n      mDice: 88.92\n      Dice: 79.45\n";
        let unet = parse(dice, "unet/metafile.yaml").unwrap();
        assert_eq!(unet[0].1.other_metric.as_deref(), Some("mDice 88.92"));
        // OCRNet's metafile quotes a YAML comment as the dataset.
        let comment = "Models:\n- Name: ocrnet\n  Results:\n    Dataset: '# HRNet backbone'\n    Metrics:\n      mIoU: 80.1\n";
        let ocrnet = parse(comment, "ocrnet/metafile.yaml").unwrap();
        assert_eq!(ocrnet[0].1.dataset, None);
        assert_eq!(ocrnet[0].1.miou, Some(80.1));
    }

    #[test]
    fn a_broken_metafile_is_named_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("a/metafile.yaml"), SEGFORMER).unwrap();
        std::fs::write(dir.path().join("b/metafile.yaml"), "Models: [\n  - :").unwrap();
        let (found, errors) = read_tree(dir.path());
        assert!(found.contains_key("segformer_mit-b0_8xb2-160k_ade20k-512x512"));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].to_string().contains("b/metafile.yaml"),
            "{}",
            errors[0]
        );
    }
}
