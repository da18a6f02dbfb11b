//! build/lua.rs as a filter: a script with named records on stdin, the
//! script Redis runs on stdout (benches/redis_instructions.sh builds it with
//! `rustc --edition 2024 build/lua_filter.rs`).

#[path = "lua.rs"]
mod lua;

fn main() {
    use std::io::Read;
    let mut source = String::new();
    std::io::stdin().read_to_string(&mut source).expect("stdin");
    match lua::expand(&source) {
        Ok(script) => print!("{script}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
