//! Shell completions and man pages, generated from a binary's own clap definition
//! with clap's crates (`clap_complete`, `clap_mangen`): what `sliceway-agent
//! completions SHELL` and `sliceway-agent man` (and the controller's) print.

use std::io::Write;

pub use clap_complete::Shell;

/// The `completions` and `man` subcommands' arguments, the same in both binaries.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum Generate {
    /// Print a shell completion script for this binary: `bash`, `zsh`, `fish`,
    /// `elvish` or `powershell` (e.g. `sliceway-agent completions bash >
    /// /etc/bash_completion.d/sliceway-agent`).
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print this binary's man page (roff), its subcommands listed; with `--dir`,
    /// write it and one page per subcommand (`NAME-SUBCOMMAND.1`) there instead.
    Man {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

/// Writes `cmd`'s completion script for `shell` to `out`.
pub fn completions(mut cmd: clap::Command, shell: Shell, out: &mut dyn Write) {
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, out);
}

/// Writes `cmd`'s man page to `out`.
pub fn man(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    clap_mangen::Man::new(cmd).render(out)
}

/// Writes `cmd`'s man page and one per subcommand (`NAME-SUB.1`, titled so) into
/// `dir`; returns the files written.
pub fn man_pages(
    cmd: clap::Command,
    dir: &std::path::Path,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = cmd;
    cmd.build();
    let name = cmd.get_name().to_string();
    let mut pages = vec![(name.clone(), cmd.clone())];
    let listed = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help");
    for sub in listed {
        pages.push((format!("{name}-{}", sub.get_name()), sub.clone()));
    }
    let mut written = Vec::new();
    for (page, cmd) in pages {
        let path = dir.join(format!("{page}.1"));
        let mut file = std::fs::File::create(&path)?;
        clap_mangen::Man::new(cmd).title(page).render(&mut file)?;
        written.push(path);
    }
    Ok(written)
}

/// Runs a [`Generate`] subcommand for `cmd`, printing to stdout (a closed pipe,
/// `| head`, is not an error).
pub fn run(generate: &Generate, cmd: clap::Command) -> std::io::Result<()> {
    let mut text = Vec::new();
    match generate {
        Generate::Completions { shell } => completions(cmd, *shell, &mut text),
        Generate::Man { dir: None } => man(cmd, &mut text)?,
        Generate::Man { dir: Some(dir) } => {
            for path in man_pages(cmd, dir)? {
                writeln!(text, "wrote {}", path.display())?;
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&text).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// The names of `cmd`'s subcommands (clap's `help` aside), for the tests of each
/// binary's generated output.
pub fn subcommand_names(cmd: &clap::Command) -> Vec<String> {
    cmd.get_subcommands()
        .map(|s| s.get_name().to_string())
        .filter(|n| n != "help")
        .collect()
}

/// Checks that the man page and every shell's completions generated for `cmd` name
/// each of its subcommands; the first that does not, as an error.
pub fn check_names_subcommands(cmd: &clap::Command) -> Result<(), String> {
    let names = subcommand_names(cmd);
    let mut outputs = Vec::new();
    let mut page = Vec::new();
    man(cmd.clone(), &mut page).map_err(|e| e.to_string())?;
    outputs.push((
        "man".to_string(),
        String::from_utf8_lossy(&page).replace("\\-", "-"),
    ));
    for shell in [
        Shell::Bash,
        Shell::Zsh,
        Shell::Fish,
        Shell::Elvish,
        Shell::PowerShell,
    ] {
        let mut script = Vec::new();
        completions(cmd.clone(), shell, &mut script);
        outputs.push((
            shell.to_string(),
            String::from_utf8_lossy(&script).into_owned(),
        ));
    }
    for (what, text) in &outputs {
        for name in &names {
            if !text.contains(name.as_str()) {
                return Err(format!(
                    "the {what} output does not name the subcommand {name}"
                ));
            }
        }
    }
    Ok(())
}
