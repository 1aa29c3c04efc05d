//! The `segtune` command line: argument parsing and output, nothing else.
//! Every bad input ends with a message on stderr and exit code 2.

use crate::config::{self, dump, presets, ConfigError};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

/// Exit code of every usage or input error.
pub const EXIT_INPUT_ERROR: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "segtune",
    version,
    about = "Find the MMSegmentation training config that fits your GPU, by measurement"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a config fully resolved, as MMEngine's Config.fromfile would.
    Resolve {
        /// An MMSeg Python config (.py) or a segtune Rhai config (.rhai).
        config: PathBuf,
        /// Output format: py (loadable by mmengine, keys sorted), json
        /// (tuples as {"__tuple__": [...]}), rhai.
        #[arg(long, value_enum, default_value = "py")]
        format: dump::Format,
        /// Override settings, as tools/train.py's --cfg-options: KEY=VALUE
        /// with dotted keys (list items by index: a.0.b=1).
        #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
        cfg_options: Vec<String>,
    },
    /// List the shipped GPU presets (for --preset and `import` in .rhai configs).
    Presets,
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_INPUT_ERROR } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match run(cli) {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`segtune resolve x.py | head`) is not an error.
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            0
        }
        Err(e) => {
            eprint!("{e}");
            EXIT_INPUT_ERROR
        }
    }
}

/// Runs one command and returns everything it prints on success, so that
/// nothing reaches stdout when it fails half-way.
pub fn run(cli: Cli) -> Result<String, ConfigError> {
    match cli.command {
        Command::Resolve {
            config,
            format,
            cfg_options,
        } => {
            let cfg = config::resolve(&config, &cfg_options)?;
            dump::render(&cfg, format)
        }
        Command::Presets => {
            let mut out = String::new();
            for name in presets::names() {
                let p = presets::load(name)?;
                let get = |k: &str| p.get(k).map(config::value::python_str).unwrap_or_default();
                out.push_str(&format!(
                    "{name:18} {:32} {:>7} MiB  cc {}  bf16 {}\n",
                    get("name"),
                    get("vram_mib"),
                    get("compute_capability"),
                    get("bf16")
                ));
            }
            Ok(out)
        }
    }
}
