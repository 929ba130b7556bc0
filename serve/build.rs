include!("../build-support/torch_link.rs");

fn main() {
    link_libtorch();
}
