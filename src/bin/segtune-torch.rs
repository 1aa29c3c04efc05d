//! segtune's libtorch worker; see `segtune::trial::worker`.
fn main() {
    std::process::exit(segtune::trial::worker::main());
}
