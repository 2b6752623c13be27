//! Directory trust: `OPDUMP_DIR` and the levels below it are judged by
//! owner and mode, and the levels are never reached through a link.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use opdump_fsguard::{check_dump_dir, enter_dir, open_dump_root, DirProblem, DirRefused};

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// `name` entered below `root` (opened as OPDUMP_DIR) with a private mode.
fn enter_below(root: &Path, name: &str) -> Result<(), DirRefused> {
    let mut dir = open_dump_root(root, 0o700).expect("the root is ours");
    enter_dir(&mut dir, root, name, 0o700).map(drop)
}

/// Another user's uid, when this process may give files away (root).
fn other_uid() -> Option<u32> {
    // SAFETY: geteuid cannot fail.
    (unsafe { libc::geteuid() } == 0).then_some(65534)
}

#[test]
fn a_world_or_group_writable_dump_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shared");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o777);
    let msg = check_dump_dir(&dir, 0o700).unwrap_err();
    assert!(
        msg.starts_with(&format!("OPDUMP_DIR={} ", dir.display())),
        "{msg}"
    );
    assert!(msg.contains("writable by other users (mode 0777"), "{msg}");
    assert!(msg.contains("chmod g-w,o-w"), "{msg}");
    chmod(&dir, 0o770);
    assert!(check_dump_dir(&dir, 0o700)
        .unwrap_err()
        .contains("mode 0770"));
}

#[test]
fn writable_bits_that_the_file_mode_grants_or_a_sticky_bit_are_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("team");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o770);
    // OPDUMP_FILE_MODE=660 asks for group-writable files and directories.
    check_dump_dir(&dir, 0o770).unwrap();
    assert!(check_dump_dir(&dir, 0o750).is_err());
    // A sticky directory (as /tmp): others cannot rename or remove our entries.
    chmod(&dir, 0o1777);
    check_dump_dir(&dir, 0o700).unwrap();
}

#[test]
fn a_missing_dump_dir_is_created_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/dump");
    check_dump_dir(&dir, 0o700).unwrap();
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
    let blocker = tmp.path().join("file");
    fs::write(&blocker, b"x").unwrap();
    let msg = check_dump_dir(&blocker, 0o700).unwrap_err();
    assert!(msg.contains("writable directory"), "{msg}");
    let msg = check_dump_dir(&blocker.join("dump"), 0o700).unwrap_err();
    assert!(
        msg.contains("cannot be created") && msg.contains("writable directory"),
        "{msg}"
    );
}

#[test]
fn a_dump_dir_or_level_of_another_user_is_refused() {
    let Some(uid) = other_uid() else {
        eprintln!("skipped: only root can give a directory to another user");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("theirs");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
    // Root may write there (access() says yes): only the owner check refuses it.
    let msg = check_dump_dir(&dir, 0o700).unwrap_err();
    assert!(
        msg.contains(&format!("owned by another user (uid {uid}")),
        "{msg}"
    );
    let root = tmp.path().join("ours");
    fs::create_dir_all(root.join("rank=0")).unwrap();
    std::os::unix::fs::chown(root.join("rank=0"), Some(uid), Some(uid)).unwrap();
    let refused = enter_below(&root, "rank=0").unwrap_err();
    assert!(
        matches!(refused.problem, DirProblem::OwnedByOther { uid: u, .. } if u == uid),
        "{refused}"
    );
}

#[test]
fn a_level_that_is_a_link_or_a_file_is_refused_and_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("dump");
    let elsewhere = tmp.path().join("elsewhere");
    fs::create_dir(&root).unwrap();
    fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("rank=0")).unwrap();
    let refused = enter_below(&root, "rank=0").unwrap_err();
    assert!(matches!(refused.problem, DirProblem::Link), "{refused}");
    assert_eq!(refused.path, root.join("rank=0"));
    assert!(refused.to_string().contains("symbolic link"), "{refused}");
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);

    fs::write(root.join("rank=1"), b"x").unwrap();
    let refused = enter_below(&root, "rank=1").unwrap_err();
    assert!(
        matches!(refused.problem, DirProblem::NotDirectory),
        "{refused}"
    );
}

#[test]
fn a_writable_level_is_refused_and_a_missing_one_created_private() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("dump");
    fs::create_dir_all(root.join("rank=0")).unwrap();
    chmod(&root.join("rank=0"), 0o777);
    let refused = enter_below(&root, "rank=0").unwrap_err();
    assert!(
        matches!(
            refused.problem,
            DirProblem::WritableByOthers { mode: 0o777 }
        ),
        "{refused}"
    );
    enter_below(&root, "rank=1").unwrap();
    assert_eq!(
        fs::metadata(root.join("rank=1")).unwrap().mode() & 0o7777,
        0o700
    );
}
