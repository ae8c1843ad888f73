//! The one allocator setting the daemon makes at startup.
//!
//! A Status document with 10,000 claims, a Synchronize of a few thousand containers or a
//! checkpoint snapshot read at startup are buffers of megabytes that live for milliseconds. glibc
//! serves allocations over its mmap threshold (128 KiB at first) as their own mappings, which go
//! back to the system when freed, but it raises that threshold to the size of each such buffer
//! freed: later buffers of that size then come from the heap, and the heap keeps their pages.
//! Measured with the daemon bench (docs/performance.md): five Status calls with 10,000 claims
//! left RSS 14 MiB higher with the threshold free to move, 0.3 MiB with it fixed.
#![allow(unsafe_code)]

/// The threshold the daemon fixes: glibc's own starting value.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`], so large buffers return to the system
/// when freed. Returns whether the setting took (always `false` off glibc, where nothing is done).
pub fn return_large_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` changes a tunable of glibc's allocator under the allocator's own lock
        // (it is safe to call from any thread at any time); its arguments are plain integers and
        // the value is within the range glibc accepts (0 to 32 MiB on 64-bit).
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_threshold_is_accepted() {
        assert!(super::return_large_buffers());
    }
}
