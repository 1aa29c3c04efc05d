//! segtune's libtorch worker; see `segtune::cli::worker`.
fn main() {
    std::process::exit(segtune::cli::worker::main());
}
