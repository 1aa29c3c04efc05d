//! `segtune inspect`'s text: the model's types, whether segtune builds it
//! (and if not why), and its parameters per top-level module.

use super::table;
use crate::worker::ModelSummary;

/// The summary as text.
pub fn inspect(s: &ModelSummary) -> String {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut out = format!(
        "config: {}\nmodel_type: {}\nbackbone_type: {}\ndecode_head_type: {}\n",
        s.config,
        dash(&s.model_type),
        dash(&s.backbone_type),
        dash(&s.decode_head_type)
    );
    if !s.supported {
        out.push_str(&format!(
            "supported: no ({})\n",
            s.reason.as_deref().unwrap_or("")
        ));
        if let Some(note) = &s.note {
            out.push_str(&format!("help: {note}\n"));
        }
        return out;
    }
    out.push_str("supported: yes\n");
    if let Some(note) = &s.note {
        out.push_str(&format!("note: {note}\n"));
    }
    out.push_str(&format!(
        "parameters: {} total, {} trainable\n",
        s.params_total.unwrap_or(0),
        s.params_trainable.unwrap_or(0)
    ));
    if let Some(by) = &s.params_by_prefix {
        let rows = by
            .iter()
            .map(|(k, c)| [k.clone(), c.total.to_string(), c.trainable.to_string()]);
        out.push_str(&table(["module", "total", "trainable"], rows));
        out.push('\n');
    }
    out
}
