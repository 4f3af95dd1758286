//! The `smolbox` command.

fn main() {
    eprintln!("smolbox: not built yet");
    std::process::exit(2);
}
