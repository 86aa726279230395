//! docs/commands.md against clap's own description of the command line (`Cli::command()`):
//! its flags table is generated from it, and every subcommand has a line in its table of
//! commands. `SLICELET_BLESS=1 cargo test --test integration commands_doc` rewrites the flags
//! table after a flag changes.

use clap::CommandFactory as _;
use slicelet::cli::Cli;

use crate::common::{read, repo};

const DOC: &str = "docs/commands.md";
const BEGIN: &str = "<!-- flags table: begin (generated from clap; SLICELET_BLESS=1 cargo test --test integration commands_doc rewrites it) -->";
const END: &str = "<!-- flags table: end -->";

/// One row of the table: a flag as clap has it, and the commands that take it.
struct Row {
    flag: String,
    env: Option<String>,
    default: String,
    help: String,
    commands: Vec<String>,
}

/// Every subcommand's path (`run`, `hook set-memory-limits`) with the command itself, depth
/// first in declaration order; `help` left out.
fn subcommands(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let p = format!("{path} {}", sub.get_name()).trim().to_string();
        if sub.has_subcommands() {
            subcommands(sub, &p, out);
        } else {
            out.push((p, sub.clone()));
        }
    }
}

fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn row_of(arg: &clap::Arg) -> Option<Row> {
    let long = arg.get_long()?;
    if matches!(long, "help" | "version") {
        return None;
    }
    let mut flag = format!("`--{long}`");
    if let Some(short) = arg.get_short() {
        flag.push_str(&format!(", `-{short}`"));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let default = if defaults.is_empty() {
        String::new()
    } else {
        format!("`{}`", defaults.join(","))
    };
    let mut help = cell(&arg.get_help().map(ToString::to_string).unwrap_or_default());
    // clap drops the doc comment's closing period.
    if !help.is_empty() && !help.ends_with(['.', '!', '?']) {
        help.push('.');
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !values.is_empty() && !matches!(arg.get_action(), clap::ArgAction::SetTrue) {
        help.push_str(&format!(" One of {}.", values.join(", ")));
    }
    if arg.is_hide_set() {
        help.push_str(" (Not in `--help`.)");
    }
    Some(Row {
        flag,
        env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
        default,
        help,
        commands: Vec::new(),
    })
}

/// Every flag of every command, one row per distinct flag (the same flag, variable, default
/// and help in several commands is one row naming them all), in the order clap declares them.
fn rows() -> Vec<Row> {
    let cli = Cli::command();
    let mut rows: Vec<Row> = Vec::new();
    let mut add = |arg: &clap::Arg, command: &str| {
        let Some(row) = row_of(arg) else { return };
        let same = rows.iter_mut().find(|r| {
            (&r.flag, &r.env, &r.default, &r.help) == (&row.flag, &row.env, &row.default, &row.help)
        });
        match same {
            Some(r) => r.commands.push(command.to_string()),
            None => rows.push(Row {
                commands: vec![command.to_string()],
                ..row
            }),
        }
    };
    for arg in cli.get_arguments().filter(|a| a.is_global_set()) {
        add(arg, "every command");
    }
    let mut subs = Vec::new();
    subcommands(&cli, "", &mut subs);
    for (path, cmd) in &subs {
        for arg in cmd.get_arguments().filter(|a| !a.is_global_set()) {
            add(arg, path);
        }
    }
    rows
}

fn table() -> String {
    let mut t = String::from(
        "| flag | environment variable | default | commands | what |\n|---|---|---|---|---|\n",
    );
    for r in rows() {
        let env = r
            .env
            .as_deref()
            .map(|e| format!("`{e}`"))
            .unwrap_or_default();
        let commands: Vec<String> = r
            .commands
            .iter()
            .map(|c| {
                if c == "every command" {
                    c.clone()
                } else {
                    format!("`{c}`")
                }
            })
            .collect();
        t.push_str(&format!(
            "| {} | {env} | {} | {} | {} |\n",
            r.flag,
            r.default,
            commands.join(", "),
            r.help
        ));
    }
    t
}

/// The doc's text, and the generated table's place in it.
fn doc_section() -> (String, std::ops::Range<usize>) {
    let doc = read(&repo().join(DOC));
    let start = doc
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{DOC} lacks the line {BEGIN}"))
        + BEGIN.len()
        + 1;
    let end = doc
        .find(END)
        .unwrap_or_else(|| panic!("{DOC} lacks the line {END}"));
    (doc, start..end)
}

/// The flags table is clap's: every flag and variable of every command, its default and its
/// help. A flag or variable missing from it is named.
#[test]
fn the_flags_table_of_docs_commands_is_claps() {
    let (doc, range) = doc_section();
    let want = table();
    if doc[range.clone()] == want {
        return;
    }
    if std::env::var_os("SLICELET_BLESS").is_some() {
        let mut new = doc.clone();
        new.replace_range(range, &want);
        std::fs::write(repo().join(DOC), new).unwrap();
        return;
    }
    let section = &doc[range];
    let mut missing = Vec::new();
    for r in rows() {
        if !section.contains(&r.flag) {
            missing.push(format!("flag {} ({})", r.flag, r.commands.join(", ")));
        }
        if let Some(env) = &r.env {
            if !section.contains(&format!("`{env}`")) {
                missing.push(format!("variable {env} ({})", r.flag));
            }
        }
    }
    panic!(
        "{DOC}'s flags table is not clap's{}; SLICELET_BLESS=1 cargo test --test integration \
         commands_doc rewrites it",
        if missing.is_empty() {
            String::from(" (a default or a help text differs)")
        } else {
            format!(": it lacks {}", missing.join(", "))
        }
    );
}

/// Every subcommand has a row `| `slicelet <command> …` | what it does |` in the table of
/// commands.
#[test]
fn docs_commands_names_every_subcommand() {
    let (doc, range) = doc_section();
    let commands = &doc[..range.start];
    let mut subs = Vec::new();
    subcommands(&Cli::command(), "", &mut subs);
    let missing: Vec<&str> = subs
        .iter()
        .filter(|(path, cmd)| {
            !cmd.is_hide_set() && !commands.contains(&format!("\n| `slicelet {path}"))
        })
        .map(|(path, _)| path.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{DOC}'s table of commands has no `slicelet …` line for {missing:?}"
    );
}
