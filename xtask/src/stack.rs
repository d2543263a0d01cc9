//! `cargo xtask stack`: the deepest BPF-to-BPF call chain of each program
//! and the stack its frames take, read from the built eBPF object, for the
//! verifier's "combined stack size of N calls is M. Too large" (512 bytes
//! along any chain, kernel/bpf/verifier.c `check_max_stack_depth`, which
//! also rounds every frame up: to 32 bytes on most setups, so its sum is
//! larger than the one printed here; compare against a build that loads).
//!
//! A frame is the deepest `r10 - N` the function touches. Calls into
//! `.text` are found from their relocations (`R_BPF_64_32`, against the
//! section: target instruction = immediate + 1) or, inside `.text`, from
//! their pc-relative immediates (helper calls carry small helper ids).
//! llvm-objdump is LLVM's (the bpf-linker toolchain has it).
use std::{collections::HashMap, path::PathBuf, process::Command};

use anyhow::{bail, Context};

pub fn run(root: &std::path::Path) -> anyhow::Result<()> {
    let object = newest_object(root)?;
    let objdump = ["llvm-objdump-22", "llvm-objdump"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .context("no llvm-objdump (apt install llvm)")?;
    let out = Command::new(objdump)
        .args(["-dr", "--no-show-raw-insn"])
        .arg(&object)
        .output()?;
    if !out.status.success() {
        bail!("{objdump} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let graph = Graph::parse(&String::from_utf8_lossy(&out.stdout));
    eprintln!("xtask: {}", object.display());
    let mut programs: Vec<&String> = graph
        .frames
        .keys()
        .filter(|f| f.starts_with("lb_"))
        .collect();
    programs.sort();
    for p in programs {
        let (total, chain) = graph.deepest(p, &mut Vec::new());
        println!("{p}: {total} bytes over {} calls", chain.len());
        for (f, frame) in chain {
            println!("  {frame:>4}  {}", demangle(&f));
        }
    }
    Ok(())
}

/// The object the last `cargo build` embedded (aya-build's output).
fn newest_object(root: &std::path::Path) -> anyhow::Result<PathBuf> {
    let build = root.join("target/debug/build");
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for dir in std::fs::read_dir(&build).with_context(|| format!("{}", build.display()))? {
        let p = dir?
            .path()
            .join("out/aya-build/target/lb-ebpf/bpfel-unknown-none/release/lb-ebpf");
        if let Ok(m) = p.metadata().and_then(|m| m.modified()) {
            if best.as_ref().is_none_or(|(t, _)| m > *t) {
                best = Some((m, p));
            }
        }
    }
    best.map(|(_, p)| p)
        .context("no eBPF object: run `cargo build --bins` first")
}

#[derive(Default)]
struct Graph {
    /// Function → the deepest stack offset it uses.
    frames: HashMap<String, u64>,
    /// Function → called functions.
    calls: HashMap<String, Vec<String>>,
}

impl Graph {
    fn parse(text: &str) -> Self {
        let mut g = Graph::default();
        // (section, instruction index) → function starting there.
        let mut starts: HashMap<(String, u64), String> = HashMap::new();
        let mut raw_calls: Vec<(String, String, u64)> = Vec::new();
        let (mut section, mut current) = (String::new(), None::<String>);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if let Some(s) = line.strip_prefix("Disassembly of section ") {
                section = s.trim_end_matches(':').to_string();
                continue;
            }
            if let Some((addr, name)) = function_header(line) {
                starts.insert((section.clone(), addr / 8), name.clone());
                g.frames.insert(name.clone(), 0);
                current = Some(name);
                continue;
            }
            let Some(f) = current.as_ref() else { continue };
            if let Some(off) = stack_offset(line) {
                let e = g.frames.entry(f.clone()).or_default();
                *e = (*e).max(off);
            }
            if let Some((index, imm)) = call(line) {
                let next = lines.get(i + 1).copied().unwrap_or("");
                if next.contains("R_BPF_64_32") {
                    if next.trim_end().ends_with(".text") {
                        raw_calls.push((f.clone(), ".text".into(), (imm + 1) as u64));
                    }
                } else if section == ".text" && !(0..=0x200).contains(&imm) {
                    raw_calls.push((f.clone(), ".text".into(), (index + imm + 1) as u64));
                }
            }
        }
        for (from, sec, at) in raw_calls {
            if let Some(to) = starts.get(&(sec, at)) {
                g.calls.entry(from).or_default().push(to.clone());
            }
        }
        g
    }

    /// The chain under `f` whose frames sum highest, with that sum.
    fn deepest(&self, f: &str, path: &mut Vec<String>) -> (u64, Vec<(String, u64)>) {
        let own = self.frames.get(f).copied().unwrap_or(0).div_ceil(8) * 8;
        path.push(f.to_string());
        let mut best = (0, Vec::new());
        for c in self.calls.get(f).into_iter().flatten() {
            if path.contains(c) {
                continue;
            }
            let d = self.deepest(c, path);
            if d.0 > best.0 {
                best = d;
            }
        }
        path.pop();
        let mut chain = vec![(f.to_string(), own)];
        chain.extend(best.1);
        (own + best.0, chain)
    }
}

/// `0000000000001148 <name>:`
fn function_header(line: &str) -> Option<(u64, String)> {
    let (addr, rest) = line.split_once(" <")?;
    let name = rest.strip_suffix(">:")?;
    Some((u64::from_str_radix(addr, 16).ok()?, name.to_string()))
}

/// The N of `r10 - 0xN)`, the deepest of the line.
fn stack_offset(line: &str) -> Option<u64> {
    line.match_indices("r10 - 0x")
        .filter_map(|(i, m)| {
            let hex: String = line[i + m.len()..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .collect();
            u64::from_str_radix(&hex, 16).ok()
        })
        .max()
}

/// `553: call 0x1a0c` (a tab after the colon) → (553, 0x1a0c); negative immediates too.
fn call(line: &str) -> Option<(i64, i64)> {
    let (index, rest) = line.trim_start().split_once(':')?;
    let imm = rest.trim().strip_prefix("call ")?;
    let (neg, hex) = match imm.strip_prefix('-') {
        Some(h) => (true, h),
        None => (false, imm),
    };
    let v = i64::from_str_radix(hex.strip_prefix("0x")?, 16).ok()?;
    Some((index.trim().parse().ok()?, if neg { -v } else { v }))
}

/// The readable part of a mangled Rust name: `lb_ebpf::packet::snat::alloc`.
fn demangle(name: &str) -> String {
    let Some(body) = name.strip_prefix("_ZN") else {
        return name.to_string();
    };
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(len_end) = rest.find(|c: char| !c.is_ascii_digit()) {
        let Ok(len) = rest[..len_end].parse::<usize>() else {
            break;
        };
        let part = &rest[len_end..(len_end + len).min(rest.len())];
        parts.push(part);
        rest = &rest[(len_end + len).min(rest.len())..];
    }
    // The last part is the hash (h0123…).
    if parts
        .last()
        .is_some_and(|p| p.starts_with('h') && p.len() == 17)
    {
        parts.pop();
    }
    parts.join("::")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_chain_through_a_relocation_and_a_local_call_sums_its_frames() {
        let text = "\
Disassembly of section classifier:

0000000000000000 <lb_tc_ingress>:
       0:\t*(u64 *)(r10 - 0x78) = r1
       1:\tcall -0x1
\t\t0000000000000008:  R_BPF_64_32\t.text
       2:\tcall 0x1
       3:\texit

Disassembly of section .text:

0000000000000000 <_ZN7lb_ebpf6packet4snat5alloc17h48b23145b9043a51E>:
       0:\t*(u64 *)(r10 - 0x68) = r1
       1:\tcall 0x3e8
       2:\texit

0000000000001f50 <_ZN7lb_ebpf6packet4snat8reusable17h9a36193351ecf7b6E>:
    1002:\t*(u64 *)(r10 - 0x38) = r1
    1003:\texit
";
        let g = Graph::parse(text);
        let (total, chain) = g.deepest("lb_tc_ingress", &mut Vec::new());
        assert_eq!(total, 120 + 104 + 56, "{chain:?}");
        assert_eq!(
            demangle(&chain[2].0),
            "lb_ebpf::packet::snat::reusable",
            "{chain:?}"
        );
    }
}
