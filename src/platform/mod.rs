//! The operating system's calls, in one place, each with the fallback the other platforms get.
//! docs/platforms.md's table says, feature by feature, what each platform gives up and what it
//! costs. Outside this module (and tests), the code names no `libc`, `std::os::unix`,
//! `std::os::windows` or `/proc`: it asks here.

pub mod fs;
pub mod memory;
pub mod process;
pub mod stdio;
