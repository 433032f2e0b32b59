//! How `runner setup` and `undo` touch a runner directory: usually as root (`sudo`), in a
//! directory that the runner's user, and so every job, controls. A job may plant links there
//! between two set-ups, and swap them while set-up runs. So every path is opened relative to the
//! runner directory's descriptor (itself opened component by component), never following a
//! symbolic link; a new file is created exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`) under a random
//! name and renamed over the old one, so a planted link is replaced, never written through.
//!
//! The rule for `.env` and `.hoard`: each must be what it claims to be (a regular file with one
//! link; a directory), not a symbolic link, and owned by root or by the runner directory's owner.
//! Anything else was put there by another user, and set-up refuses to touch it, saying why.
//! `.env` keeps its owner, group and mode when rewritten; a new one gets the runner directory's
//! owner and group and mode 0644, as `config.sh` would have left it.

use std::ffi::OsStr;
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// The name `.env` is opened by.
pub const ENV: &str = ".env";
/// The directory that holds the preload and the hook.
pub const HOARD: &str = ".hoard";

/// A file that was there, and what its replacement keeps.
#[derive(Debug)]
pub struct Existing {
    pub text: String,
    mode: u32,
    uid: u32,
    gid: u32,
}

/// The runner directory, open.
#[derive(Debug)]
pub struct RunnerFs {
    root: OwnedFd,
    path: PathBuf,
    owner: u32,
    group: u32,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

impl RunnerFs {
    /// Opens `root` (an absolute path without links, as `canonicalize` gives it) one component
    /// at a time, following no link: a directory swapped for a link meanwhile is refused.
    pub fn open(root: &Path) -> Result<Self, String> {
        let cannot = |e: Errno| format!("cannot open {}: {e}", root.display());
        let mut fd = rfs::open("/", dir_flags(), Mode::empty()).map_err(cannot)?;
        for component in root.components() {
            match component {
                Component::RootDir => {}
                Component::Normal(name) => {
                    fd = rfs::openat(&fd, name, dir_flags(), Mode::empty()).map_err(|e| {
                        if e == Errno::LOOP || e == Errno::NOTDIR {
                            format!("{} changed while hoard was opening it (a component is now a symbolic link); run this again", root.display())
                        } else {
                            cannot(e)
                        }
                    })?;
                }
                _ => return Err(format!("{} is not an absolute path", root.display())),
            }
        }
        let st = rfs::fstat(&fd).map_err(cannot)?;
        Ok(Self {
            root: fd,
            path: root.to_owned(),
            owner: st.st_uid,
            group: st.st_gid,
        })
    }

    fn shown(&self, rel: &str) -> String {
        self.path.join(rel).display().to_string()
    }

    /// What `name` in `dir` is, without following it: `None` if absent; refused if a link or
    /// owned by another user.
    fn inspect(&self, dir: &OwnedFd, rel: &str, name: &str) -> Result<Option<Stat>, String> {
        let st = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(format!("cannot inspect {}: {e}", self.shown(rel))),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            let to = rfs::readlinkat(dir, name, Vec::new())
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "?".to_owned());
            return Err(format!(
                "{} is a symbolic link (to {to}). hoard runner set-up never follows a link in the runner directory: it runs as root there, and any job of this runner can plant one to make it write elsewhere. Check where it points and what changed there, remove the link, and run this again",
                self.shown(rel)
            ));
        }
        if st.st_uid != 0 && st.st_uid != self.owner {
            return Err(format!(
                "{} is owned by uid {}, neither root nor the runner directory's owner (uid {}): another user put it there, so hoard runner set-up will not use it. Check it, remove it (or give it to the runner's user), and run this again",
                self.shown(rel),
                st.st_uid,
                self.owner
            ));
        }
        Ok(Some(st))
    }

    /// `.env`, if there is one: a regular file with one link, not a symbolic link, owned by root
    /// or by the runner directory's owner.
    pub fn read_env(&self) -> Result<Option<Existing>, String> {
        if self.inspect(&self.root, ENV, ENV)?.is_none() {
            return Ok(None);
        }
        let fd = rfs::openat(
            &self.root,
            ENV,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", self.shown(ENV)))?;
        let st = rfs::fstat(&fd).map_err(|e| format!("cannot open {}: {e}", self.shown(ENV)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(format!("{} is not a regular file", self.shown(ENV)));
        }
        if st.st_nlink != 1 {
            return Err(format!(
                "{} has {} hard links: it is also a file elsewhere, which set-up must not read or copy as root. Replace it with a copy (cp --remove-destination), and run this again",
                self.shown(ENV),
                st.st_nlink
            ));
        }
        if st.st_uid != 0 && st.st_uid != self.owner {
            return Err(format!(
                "{} is owned by uid {}, neither root nor the runner directory's owner (uid {}): another user put it there",
                self.shown(ENV),
                st.st_uid,
                self.owner
            ));
        }
        let mut text = String::new();
        std::fs::File::from(fd)
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read {}: {e}", self.shown(ENV)))?;
        // `mode_t` is u16 on macOS.
        #[allow(clippy::useless_conversion)]
        let mode = u32::from(st.st_mode) & 0o7777;
        Ok(Some(Existing {
            text,
            mode,
            uid: st.st_uid,
            gid: st.st_gid,
        }))
    }

    /// Replaces `.env` with `text`, keeping the owner, group and mode of `was`.
    pub fn write_env(&self, text: &str, was: Option<&Existing>) -> Result<(), String> {
        let (mode, uid, gid) = match was {
            Some(was) => (was.mode, was.uid, was.gid),
            None => (0o644, self.owner, self.group),
        };
        write_new(&self.root, ENV, text.as_bytes(), mode, Some((uid, gid)))
            .map_err(|e| format!("cannot write {}: {e}", self.shown(ENV)))
    }

    /// `.hoard`, open: a directory, not a link, owned by root or the runner directory's owner.
    /// `None` if absent and not `create`d.
    pub fn hoard_dir(&self, create: bool) -> Result<Option<OwnedFd>, String> {
        if self.inspect(&self.root, HOARD, HOARD)?.is_none() {
            if !create {
                return Ok(None);
            }
            match rfs::mkdirat(&self.root, HOARD, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(format!("cannot create {}: {e}", self.shown(HOARD))),
            }
            self.inspect(&self.root, HOARD, HOARD)?;
        }
        let fd = rfs::openat(&self.root, HOARD, dir_flags(), Mode::empty())
            .map_err(|e| format!("cannot open {}: {e}", self.shown(HOARD)))?;
        let st = rfs::fstat(&fd).map_err(|e| format!("cannot open {}: {e}", self.shown(HOARD)))?;
        if st.st_uid != 0 && st.st_uid != self.owner {
            return Err(format!(
                "{} is owned by uid {}, neither root nor the runner directory's owner (uid {}): another user put it there",
                self.shown(HOARD),
                st.st_uid,
                self.owner
            ));
        }
        Ok(Some(fd))
    }

    /// Where `name` in `.hoard` is, for reports.
    pub fn hoard_path(&self, name: &str) -> PathBuf {
        self.path.join(HOARD).join(name)
    }

    /// Removes `.hoard` if it is empty: anything else in it is not hoard's.
    pub fn remove_hoard_dir_if_empty(&self) {
        let _ = rfs::unlinkat(&self.root, HOARD, AtFlags::REMOVEDIR);
    }
}

/// The bytes of the regular file `name` in `dir`, not following a link.
pub fn read_regular(dir: &OwnedFd, name: &str) -> Option<Vec<u8>> {
    let fd = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rfs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Removes the entry `name` in `dir` (a link is removed, not followed); whether there was one.
pub fn remove(dir: &OwnedFd, name: &str) -> std::io::Result<bool> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Puts `bytes` at `name` in `dir` with `mode` (and, as root, `owner`): written to a new file
/// under a random name, created exclusively and not through a link, then fsynced and renamed
/// over `name`. Whatever was at `name` (a link included) is replaced, never written to.
pub fn write_new(
    dir: &OwnedFd,
    name: &str,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let (tmp, fd) = create_exclusive(dir, name)?;
    let written = (|| -> std::io::Result<()> {
        rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        if let Some((uid, gid)) = owner.filter(|_| rustix::process::geteuid().is_root()) {
            rfs::fchown(
                &fd,
                Some(rfs::Uid::from_raw(uid)),
                Some(rfs::Gid::from_raw(gid)),
            )?;
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        rfs::renameat(dir, tmp.as_str(), dir, name)?;
        rfs::fsync(dir)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    written
}

/// A new file in `dir` named after `name` plus a random part, created exclusively: a name a job
/// planted (a link included) makes this try another, never open it.
fn create_exclusive(dir: &OwnedFd, name: &str) -> std::io::Result<(String, OwnedFd)> {
    let mut last = Errno::EXIST;
    for _ in 0..16 {
        let tmp = format!(".{name}.{:016x}.hoard-tmp", rand::random::<u64>());
        match rfs::openat(
            dir,
            OsStr::new(&tmp),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => return Ok((tmp, fd)),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_link_is_replaced_not_written_through() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(&victim, root.join("file")).unwrap();
        let fs = RunnerFs::open(&root).unwrap();
        write_new(&fs.root, "file", b"new", 0o644, None).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(root.join("file")).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(root.join("file"))
            .unwrap()
            .is_file());
        // No temporary file is left.
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 1);
    }

    #[test]
    fn links_are_refused_with_the_reason() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join(HOARD)).unwrap();
        std::os::unix::fs::symlink(outside.path().join("x"), root.join(ENV)).unwrap();
        let fs = RunnerFs::open(&root).unwrap();
        let why = fs.hoard_dir(true).unwrap_err();
        assert!(why.contains("symbolic link"), "{why}");
        let why = fs.read_env().unwrap_err();
        assert!(why.contains("symbolic link"), "{why}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // A link among the runner directory's own components is refused too.
        let link = outside.path().join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        assert!(RunnerFs::open(&link).is_err());
    }
}
