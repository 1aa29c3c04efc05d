//! `EncoderDecoder` (`mmseg/models/segmentors/encoder_decoder.py`): the
//! segmentor that owns the data preprocessor, the backbone, the optional
//! neck, the decode head and the optional auxiliary heads, and the training
//! forward `data_preprocessor(data) -> extract_feat (backbone, neck) ->
//! decode_head.loss -> auxiliary_head.loss`.
//!
//! Each component is built from its role's registry table by its MMSeg
//! `type`, its parameters named under MMSeg's attribute (`backbone`, `neck`,
//! `decode_head`, `auxiliary_head` or `auxiliary_head.<i>` for a list).
//!
//! The same struct is `CascadeEncoderDecoder` (its subclass in MMSeg, see
//! [`super::cascade_encoder_decoder`]): a list of `num_stages` decode heads
//! (`decode_head.<i>`), each after the first taking the previous one's
//! logits.

use super::data_preprocessor::{PreprocessorCfg, SegDataPreProcessor};
use super::generate_edge::GenerateEdge;
use super::{SEGMENTORS, SEGMENTOR_FACTS};
use crate::config::{Dict, Value};
use crate::models::backbones::{Backbone, BACKBONES, BACKBONE_FACTS};
use crate::models::component_config::{type_of, ComponentConfig};
use crate::models::decode_heads::{DecodeHead, LossItems, DECODE_HEADS, DECODE_HEAD_FACTS};
use crate::models::necks::{Neck, NECKS, NECK_FACTS};
use crate::models::params::ParamStore;
use crate::models::registry::{check_supported, check_type, facts_of, lookup};
use crate::models::scope;
use crate::models::ModelError;
use tch::{Device, Tensor};

const SOURCE: &str = "mmseg/models/segmentors/encoder_decoder.py";

/// `EncoderDecoder.__init__`'s arguments: the components' config dicts.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderDecoderCfg<'a> {
    pub backbone: &'a Dict,
    pub neck: Option<&'a Dict>,
    /// One head, or a cascade's heads in order.
    pub decode_head: DecodeHeads<'a>,
    /// One auxiliary head (`aux`, `auxiliary_head`), or the i-th of a list
    /// (`aux_<i>`, `auxiliary_head.<i>`), as `_auxiliary_head_forward_train`
    /// and `nn.ModuleList` name them.
    pub auxiliary_heads: Vec<NamedHead<'a>>,
    pub data_preprocessor: Option<&'a Dict>,
    /// `model.train_cfg`, handed to the heads that read it (PointHead's
    /// point sampling) as their `train_cfg` key.
    pub train_cfg: Option<&'a Dict>,
    /// `model.test_cfg`, handed likewise as `test_cfg` (PointHead's
    /// subdivision steps in inference).
    pub test_cfg: Option<&'a Dict>,
}

/// `model.decode_head`: one dict (`EncoderDecoder`) or the stages of a
/// `CascadeEncoderDecoder`.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeHeads<'a> {
    Single(&'a Dict),
    Cascade(Vec<&'a Dict>),
}

/// A head's config with the two names MMSeg gives the head.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedHead<'a> {
    /// What its loss items are prefixed with (`decode`, `decode_<i>`,
    /// `aux`, `aux_<i>`).
    pub loss_prefix: String,
    /// The attribute its parameters are named under (`decode_head`,
    /// `decode_head.<i>`, `auxiliary_head`, `auxiliary_head.<i>`).
    pub param_prefix: String,
    pub cfg: &'a Dict,
}

impl<'a> NamedHead<'a> {
    /// The head `cfg` as `role` (`decode` or `aux`), alone or as the i-th of
    /// a list.
    fn new(role: Role, index: Option<usize>, cfg: &'a Dict) -> NamedHead<'a> {
        let (loss, param) = match role {
            Role::Decode => ("decode", "decode_head"),
            Role::Auxiliary => ("aux", "auxiliary_head"),
        };
        let (loss_prefix, param_prefix) = match index {
            None => (loss.to_string(), param.to_string()),
            Some(i) => (format!("{loss}_{i}"), format!("{param}.{i}")),
        };
        NamedHead {
            loss_prefix,
            param_prefix,
            cfg,
        }
    }
}

/// Which of the segmentor's head attributes a head belongs to.
#[derive(Debug, Clone, Copy)]
enum Role {
    Decode,
    Auxiliary,
}

impl<'a> DecodeHeads<'a> {
    /// Each head with its names: `decode` and `decode_head`, or `decode_<i>`
    /// and `decode_head.<i>` in a cascade.
    pub fn named(&self) -> Vec<NamedHead<'a>> {
        match self {
            DecodeHeads::Single(d) => vec![NamedHead::new(Role::Decode, None, d)],
            DecodeHeads::Cascade(stages) => stages
                .iter()
                .enumerate()
                .map(|(i, d)| NamedHead::new(Role::Decode, Some(i), d))
                .collect(),
        }
    }
}

impl<'a> EncoderDecoderCfg<'a> {
    /// Reads `cfg.model` of an `EncoderDecoder`.
    pub fn from_cfg(model: &'a Dict) -> Result<EncoderDecoderCfg<'a>, ModelError> {
        let mut c = ComponentConfig::new(model, "EncoderDecoder", SOURCE);
        let decode_head = match c.value("decode_head") {
            Some(Value::Dict(d)) => DecodeHeads::Single(d),
            Some(Value::List(_)) => {
                return Err(c.config_error(
                    "decode_head is a list: that is a CascadeEncoderDecoder (set model.type)",
                ))
            }
            _ => return Err(ModelError::config("model", "lacks `decode_head`")),
        };
        Self::read_components(c, decode_head)
    }

    /// The keys EncoderDecoder and CascadeEncoderDecoder share, after the
    /// decode head(s) were read.
    pub(super) fn read_components(
        mut c: ComponentConfig<'a>,
        decode_head: DecodeHeads<'a>,
    ) -> Result<EncoderDecoderCfg<'a>, ModelError> {
        let backbone = c
            .value("backbone")
            .and_then(Value::as_dict)
            .ok_or_else(|| ModelError::config("model", "lacks `backbone`"))?;
        let neck = match c.value("neck") {
            None | Some(Value::None) => None,
            Some(Value::Dict(d)) => Some(d),
            Some(other) => {
                return Err(ModelError::config(
                    "model.neck",
                    format!("must be a dict, not {}", other.type_name()),
                ))
            }
        };
        let auxiliary_heads = match c.value("auxiliary_head") {
            None | Some(Value::None) => Vec::new(),
            Some(Value::Dict(d)) => vec![NamedHead::new(Role::Auxiliary, None, d)],
            Some(Value::List(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    item.as_dict()
                        .map(|d| NamedHead::new(Role::Auxiliary, Some(i), d))
                        .ok_or_else(|| {
                            ModelError::config(
                                format!("model.auxiliary_head[{i}]"),
                                "must be a dict",
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(ModelError::config(
                    "model.auxiliary_head",
                    format!(
                        "must be a dict or a list of dicts, not {}",
                        other.type_name()
                    ),
                ))
            }
        };
        let data_preprocessor = c.value("data_preprocessor").and_then(Value::as_dict);
        let train_cfg = c.dict("train_cfg")?;
        // `test_cfg` is read by inference and by the heads that take it.
        let test_cfg = c.dict("test_cfg")?;
        // `pretrained` and `init_cfg` load weights.
        c.inert(&["pretrained", "init_cfg"]);
        c.finish()?;
        Ok(EncoderDecoderCfg {
            backbone,
            neck,
            decode_head,
            auxiliary_heads,
            data_preprocessor,
            train_cfg,
            test_cfg,
        })
    }
}

/// The `SEGMENTORS` row's reader of an `EncoderDecoder`'s `cfg.model`.
pub fn read_cfg(model: &Dict) -> Result<EncoderDecoderCfg<'_>, ModelError> {
    EncoderDecoderCfg::from_cfg(model)
}

/// Every component's `type` is in its table; all that are not are named,
/// in MMSeg's build order.
pub(crate) fn check_parts(cfg: &EncoderDecoderCfg) -> Result<(), ModelError> {
    let mut parts = vec![(BACKBONE_FACTS, "backbone", cfg.backbone, "backbone")];
    if let Some(neck) = cfg.neck {
        parts.push((NECK_FACTS, "neck", neck, "neck"));
    }
    for head in cfg.decode_head.named() {
        parts.push((DECODE_HEAD_FACTS, "decode head", head.cfg, "decode_head"));
    }
    for aux in &cfg.auxiliary_heads {
        parts.push((
            DECODE_HEAD_FACTS,
            "auxiliary head",
            aux.cfg,
            "auxiliary_head",
        ));
    }
    let mut unknown = Vec::new();
    for (table, role, dict, key) in parts {
        if let Err(e) = check_type(table, role, type_of(dict, key)?) {
            unknown.push(e);
        }
    }
    match unknown.len() {
        0 => Ok(()),
        1 => Err(unknown.pop().expect("one")),
        _ => Err(ModelError::UnknownTypes {
            components: unknown,
        }),
    }
}

/// The segmentor, its parameters and buffers.
pub struct EncoderDecoder {
    pub params: ParamStore,
    preprocessor: SegDataPreProcessor,
    backbone: Box<dyn Backbone>,
    neck: Option<Box<dyn Neck>>,
    /// `(loss prefix, head)`: `decode`, or `decode_<i>` per cascade stage.
    decode_heads: Vec<(String, Box<dyn DecodeHead>)>,
    /// `(loss prefix, head)`: `aux` or `aux_<i>`.
    auxiliary_heads: Vec<(String, Box<dyn DecodeHead>)>,
    device: Device,
    pub num_classes: i64,
    pub ignore_index: i64,
    /// `model.test_cfg.mode` (see `inference.rs`).
    pub test_mode: super::inference::TestMode,
    /// The training pipeline's `GenerateEdge`, whose edge maps the batch
    /// carries (required by a head with the fact `takes_edge_maps`).
    pub edge_maps: Option<GenerateEdge>,
}

impl EncoderDecoder {
    /// Builds `cfg.model` (a resolved config) on `device`, in MMSeg's
    /// registration order: data preprocessor, backbone, neck, decode head,
    /// auxiliary heads.
    pub fn build(cfg: &Dict, device: Device) -> Result<EncoderDecoder, ModelError> {
        check_supported(cfg)?;
        let model = cfg.get("model").and_then(Value::as_dict).expect("checked");
        let model_type = type_of(model, "model")?;
        let read_parts = lookup(SEGMENTORS, "segmentor", model_type)?;
        let parts = read_parts(model)?;
        let pre_cfg = PreprocessorCfg::from_cfg(parts.data_preprocessor)?;
        let mut params = ParamStore::new(device);
        let preprocessor =
            SegDataPreProcessor::new(&mut params.scope("data_preprocessor"), pre_cfg);
        let build_backbone = lookup(BACKBONES, "backbone", type_of(parts.backbone, "backbone")?)?;
        let backbone_prefix = facts_of(SEGMENTOR_FACTS, model_type)
            .backbone_prefix
            .unwrap_or("backbone");
        let backbone = build_backbone(&mut params.scope(backbone_prefix), parts.backbone)?;
        let neck = match parts.neck {
            Some(neck_cfg) => {
                let build_neck = lookup(NECKS, "neck", type_of(neck_cfg, "neck")?)?;
                Some(build_neck(&mut params.scope("neck"), neck_cfg)?)
            }
            None => None,
        };
        let cascade = matches!(parts.decode_head, DecodeHeads::Cascade(_));
        let mut decode_heads = Vec::new();
        for (stage, named) in parts.decode_head.named().into_iter().enumerate() {
            let (loss_prefix, param_prefix, head_cfg) =
                (named.loss_prefix, named.param_prefix, named.cfg);
            let head_type = type_of(head_cfg, "decode_head")?;
            let build_head = lookup(DECODE_HEADS, "decode head", head_type)?.build;
            let head = if facts_of(DECODE_HEAD_FACTS, head_type).takes_run_cfgs {
                let mut with_run_cfgs = head_cfg.clone();
                for (key, run_cfg) in [("train_cfg", parts.train_cfg), ("test_cfg", parts.test_cfg)]
                {
                    with_run_cfgs.insert(
                        key.into(),
                        Value::Dict(run_cfg.cloned().unwrap_or_default()),
                    );
                }
                build_head(&mut params.scope(&param_prefix), &with_run_cfgs)?
            } else {
                build_head(&mut params.scope(&param_prefix), head_cfg)?
            };
            // A head's forward takes prev_output exactly when it is a
            // BaseCascadeDecodeHead; MMSeg fails with a TypeError otherwise.
            let needs_prev = cascade && stage > 0;
            if head.is_cascade() != needs_prev {
                return Err(ModelError::config(
                    format!(
                        "model.{param_prefix} ({})",
                        type_of(head_cfg, "decode_head")?
                    ),
                    if needs_prev {
                        "follows another stage of a CascadeEncoderDecoder, so it must be a cascade head (OCRHead)"
                    } else if cascade {
                        "is the first stage of a CascadeEncoderDecoder: a cascade head needs a stage before it"
                    } else {
                        "is a cascade head: it needs a CascadeEncoderDecoder with a stage before it"
                    },
                ));
            }
            decode_heads.push((loss_prefix, head));
        }
        let mut auxiliary_heads = Vec::with_capacity(parts.auxiliary_heads.len());
        for aux in &parts.auxiliary_heads {
            let build_aux = lookup(
                DECODE_HEADS,
                "auxiliary head",
                type_of(aux.cfg, "auxiliary_head")?,
            )?
            .build;
            let head = build_aux(&mut params.scope(&aux.param_prefix), aux.cfg)?;
            auxiliary_heads.push((aux.loss_prefix.clone(), head));
        }
        // CascadeEncoderDecoder takes num_classes from the last stage.
        let last = &decode_heads.last().expect("at least one decode head").1;
        let (num_classes, ignore_index) = (last.num_classes(), last.ignore_index());
        let test_mode = super::inference::TestMode::from_model(model)?;
        let edge_maps = Self::edge_maps_of(cfg, &parts)?;
        Ok(EncoderDecoder {
            params,
            preprocessor,
            backbone,
            neck,
            decode_heads,
            auxiliary_heads,
            device,
            num_classes,
            ignore_index,
            test_mode,
            edge_maps,
        })
    }

    /// The pipeline's `GenerateEdge`; an error when a head reads edge maps
    /// (`takes_edge_maps`) the pipeline does not make (MMSeg's
    /// `AttributeError` on `gt_edge_map` in the first step).
    fn edge_maps_of(
        cfg: &Dict,
        parts: &EncoderDecoderCfg,
    ) -> Result<Option<GenerateEdge>, ModelError> {
        let edge_maps = GenerateEdge::from_train_pipeline(cfg)?;
        let heads = parts.decode_head.named().into_iter().map(|h| h.cfg);
        for head in heads.chain(parts.auxiliary_heads.iter().map(|a| a.cfg)) {
            let head_type = type_of(head, "decode_head")?;
            if edge_maps.is_none() && facts_of(DECODE_HEAD_FACTS, head_type).takes_edge_maps {
                return Err(ModelError::config(
                    format!("model.decode_head ({head_type})"),
                    "reads the edge maps (gt_edge_map) of the training pipeline's GenerateEdge, which the pipeline lacks",
                ));
            }
        }
        Ok(edge_maps)
    }

    /// `(loss prefix, head)` per decode head (one, or a cascade's stages).
    pub(super) fn decode_heads(&self) -> &[(String, Box<dyn DecodeHead>)] {
        &self.decode_heads
    }

    /// The data preprocessor's test path (`training=False`): the batch
    /// tensor, and per image the padding it got (`padding_size`).
    pub fn preprocess_test(
        &self,
        images: &[Tensor],
    ) -> Result<(Tensor, Vec<(i64, i64)>), ModelError> {
        self.preprocessor.forward_test(images, self.device)
    }

    /// The device the model lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The crop the data preprocessor pads to, if set.
    pub fn preprocessor_size(&self) -> Option<(i64, i64)> {
        self.preprocessor.cfg.size
    }

    /// Whether the batch arrives as one `pixel_values` tensor and one
    /// `labels` tensor (a Hugging Face model), not as per-image tensors.
    pub fn takes_pixel_values(&self) -> bool {
        self.preprocessor.cfg.pixel_values
    }

    /// Overrides the data preprocessor's `size` (what a crop change does).
    pub fn set_preprocessor_size(&mut self, size: (i64, i64)) {
        self.preprocessor.cfg.size = Some(size);
    }

    /// Data preprocessing: returns the batch tensor and the padded labels.
    pub fn preprocess(&self, images: &[Tensor], labels: &[Tensor]) -> (Tensor, Vec<Tensor>) {
        let (inputs, labels, _) = self.preprocessor.forward(images, labels, &[], self.device);
        (inputs, labels)
    }

    /// Data preprocessing of a batch with edge maps (see
    /// [`EncoderDecoder::edge_maps`]): the batch tensor, the padded labels
    /// and the padded edge maps.
    pub fn preprocess_with_edges(
        &self,
        images: &[Tensor],
        labels: &[Tensor],
        edges: &[Tensor],
    ) -> (Tensor, Vec<Tensor>, Vec<Tensor>) {
        self.preprocessor
            .forward(images, labels, edges, self.device)
    }

    /// `extract_feat`: the backbone's features, through the neck if any.
    pub(super) fn extract_feat(&self, inputs: &Tensor, training: bool) -> Vec<Tensor> {
        let features = {
            let _part = scope::enter("backbone");
            self.backbone.forward(inputs, training) // [B, C_i, H_i, W_i] per level
        };
        match &self.neck {
            Some(neck) => {
                let _part = scope::enter("neck");
                neck.forward(features, training)
            }
            None => features,
        }
    }

    /// `_decode_head_forward_train`: the decode head's loss items, or each
    /// cascade stage's.
    fn decode_head_loss(
        &self,
        features: &[Tensor],
        labels: &[Tensor],
        edges: &[Tensor],
    ) -> Vec<(String, Tensor)> {
        match self.decode_heads.as_slice() {
            [(prefix, head)] if prefix == "decode" => {
                let _part = scope::enter("decode_head");
                with_prefix(prefix, head.loss_with_edges(features, labels, edges))
            }
            stages => {
                super::cascade_encoder_decoder::decode_head_forward_train(stages, features, labels)
            }
        }
    }

    /// `EncoderDecoder.loss`: the decode head's items (`decode.loss_ce`,
    /// `decode.acc_seg`), then each auxiliary head's (`aux.loss_ce`, or
    /// `aux_0.loss_ce`, ... for a list), before `parse_losses`. The features
    /// live until every head is done, as `x` does in Python.
    pub fn loss(&self, inputs: &Tensor, labels: &[Tensor]) -> Vec<(String, Tensor)> {
        self.loss_with_edges(inputs, labels, &[])
    }

    /// [`EncoderDecoder::loss`] with the padded edge maps of
    /// [`EncoderDecoder::preprocess_with_edges`] (the data samples'
    /// `gt_edge_map`), which every head is given.
    pub fn loss_with_edges(
        &self,
        inputs: &Tensor,
        labels: &[Tensor],
        edges: &[Tensor],
    ) -> LossItems {
        let features = self.extract_feat(inputs, true);
        let mut items = self.decode_head_loss(&features, labels, edges);
        for (prefix, head) in &self.auxiliary_heads {
            // `aux` -> `auxiliary_head`, `aux_<i>` -> `auxiliary_head.<i>`.
            let _part = scope::enter(&match prefix.strip_prefix("aux_") {
                Some(i) => format!("auxiliary_head.{i}"),
                None => "auxiliary_head".to_string(),
            });
            items.extend(with_prefix(
                prefix,
                head.loss_with_edges(&features, labels, edges),
            ));
        }
        drop(features);
        items
    }
}

/// mmseg's `add_prefix(losses, prefix)`: `<prefix>.<name>`.
pub(super) fn with_prefix(prefix: &str, items: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    items
        .into_iter()
        .map(|(name, value)| (format!("{prefix}.{name}"), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use serde_json::json;

    /// A SegFormer-B0 ADE20K model (`segformer_mit-b0_8xb2-160k_ade20k-512x512`)
    /// with `auxiliary_head` set to `aux`.
    fn b0_config(aux: serde_json::Value) -> Dict {
        let head = json!({
            "type": "SegformerHead",
            "in_channels": [32, 64, 160, 256],
            "in_index": [0, 1, 2, 3],
            "channels": 256,
            "dropout_ratio": 0.1,
            "num_classes": 150,
            "norm_cfg": {"type": "SyncBN", "requires_grad": true},
            "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        });
        let aux = match aux {
            serde_json::Value::Bool(true) => head.clone(),
            serde_json::Value::Number(n) => {
                serde_json::Value::Array(vec![head.clone(); n.as_u64().unwrap() as usize])
            }
            other => other,
        };
        dict(json!({"model": {
            "type": "EncoderDecoder",
            "data_preprocessor": {
                "type": "SegDataPreProcessor",
                "mean": [123.675, 116.28, 103.53],
                "std": [58.395, 57.12, 57.375],
                "bgr_to_rgb": true, "pad_val": 0, "seg_pad_val": 255, "size": [64, 64],
            },
            "pretrained": null,
            "backbone": {
                "type": "MixVisionTransformer", "in_channels": 3, "embed_dims": 32,
                "num_stages": 4, "num_layers": [2, 2, 2, 2], "num_heads": [1, 2, 5, 8],
                "patch_sizes": [7, 3, 3, 3], "sr_ratios": [8, 4, 2, 1],
                "out_indices": [0, 1, 2, 3], "mlp_ratio": 4, "qkv_bias": true,
                "drop_rate": 0.0, "attn_drop_rate": 0.0, "drop_path_rate": 0.1,
            },
            "decode_head": head,
            "auxiliary_head": aux,
            "train_cfg": {},
            "test_cfg": {"mode": "whole"},
        }}))
    }

    fn item_names(model: &EncoderDecoder) -> Vec<String> {
        let images = vec![Tensor::zeros([3, 64, 64], (tch::Kind::Uint8, Device::Cpu))];
        let labels = vec![Tensor::zeros([1, 64, 64], (tch::Kind::Int64, Device::Cpu))];
        let (inputs, padded) = model.preprocess(&images, &labels);
        model
            .loss(&inputs, &padded)
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    // params_all.json, segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py:
    // by_prefix.backbone.total and by_prefix.decode_head.total.
    const B0_BACKBONE: i64 = 3_319_392;
    const B0_ADE_HEAD: i64 = 434_326;

    #[test]
    fn segformer_b0_matches_the_oracle_and_logs_decode_items() {
        let model = EncoderDecoder::build(&b0_config(json!(null)), Device::Cpu).unwrap();
        // params_all.json, segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py: total
        assert_eq!(model.params.total(), 3_753_718);
        assert_eq!(item_names(&model), ["decode.loss_ce", "decode.acc_seg"]);
        assert_eq!((model.num_classes, model.ignore_index), (150, 255));
    }

    #[test]
    fn one_auxiliary_head_adds_its_parameters_and_aux_items() {
        let model = EncoderDecoder::build(&b0_config(json!(true)), Device::Cpu).unwrap();
        assert_eq!(model.params.total(), B0_BACKBONE + 2 * B0_ADE_HEAD);
        let by_prefix = model.params.by_prefix();
        assert_eq!(
            by_prefix,
            [
                ("backbone".to_string(), B0_BACKBONE, B0_BACKBONE),
                ("decode_head".to_string(), B0_ADE_HEAD, B0_ADE_HEAD),
                ("auxiliary_head".to_string(), B0_ADE_HEAD, B0_ADE_HEAD),
            ]
        );
        assert!(model
            .params
            .params
            .iter()
            .any(|p| p.name == "auxiliary_head.conv_seg.weight"));
        // EncoderDecoder._auxiliary_head_forward_train: add_prefix(loss_aux, 'aux').
        assert_eq!(
            item_names(&model),
            [
                "decode.loss_ce",
                "decode.acc_seg",
                "aux.loss_ce",
                "aux.acc_seg"
            ]
        );
    }

    #[test]
    fn a_list_of_auxiliary_heads_is_numbered() {
        let model = EncoderDecoder::build(&b0_config(json!(2)), Device::Cpu).unwrap();
        assert_eq!(model.params.total(), B0_BACKBONE + 3 * B0_ADE_HEAD);
        assert!(model
            .params
            .params
            .iter()
            .any(|p| p.name == "auxiliary_head.1.fusion_conv.conv.weight"));
        // add_prefix(loss_aux, f'aux_{idx}') per head of the nn.ModuleList.
        assert_eq!(
            item_names(&model),
            [
                "decode.loss_ce",
                "decode.acc_seg",
                "aux_0.loss_ce",
                "aux_0.acc_seg",
                "aux_1.loss_ce",
                "aux_1.acc_seg"
            ]
        );
    }

    #[test]
    fn unknown_component_types_list_the_registry() {
        let mut cfg =
            b0_config(json!({"type": "VPDDepthHead", "in_channels": 160, "channels": 64}));
        let err = EncoderDecoder::build(&cfg, Device::Cpu).err().unwrap();
        let heads = crate::models::registry::names(DECODE_HEAD_FACTS).join(", ");
        assert_eq!(
            err.to_string(),
            format!("unknown auxiliary head type `VPDDepthHead`; segtune supports: {heads}")
        );
        assert!(
            heads.contains("ANNHead") && heads.contains("UPerHead"),
            "{heads}"
        );
        let model = cfg.get_mut("model").unwrap().as_dict_mut().unwrap();
        model.insert(
            "neck".into(),
            crate::models::component_config::test_support::to_value(
                &json!({"type": "NotARegisteredNeck"}),
            ),
        );
        // Every unknown type is named, each table listed once.
        let err = EncoderDecoder::build(&cfg, Device::Cpu).err().unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "unknown component types: neck `NotARegisteredNeck`, auxiliary head `VPDDepthHead`\n  \
                 necks segtune supports: {necks}\n  heads segtune supports: {heads}",
                necks = crate::models::registry::names(NECK_FACTS).join(", ")
            )
        );
    }
}
