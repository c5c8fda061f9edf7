//! Host-side launch arithmetic shared by every CUDA family: grid sizes, shared-memory budgets
//! and argument narrowing. Pure functions, unit-tested on the CPU.

use kernel_common::error::{KernelError, Result};

/// Shared memory a block may use without the opt-in attribute (48 KiB on every CUDA GPU).
pub const DEFAULT_SMEM_LIMIT: usize = 48 * 1024;
/// The largest grid x dimension.
pub const MAX_GRID_X: usize = (1 << 31) - 1;
/// The largest grid y and z dimensions.
pub const MAX_GRID_YZ: usize = 65535;
/// The most threads in one block.
pub const MAX_BLOCK_THREADS: usize = 1024;

/// A validated launch: grid, block and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
}

impl Launch {
    /// Checks the limits every CUDA device shares and narrows to the driver's types.
    pub fn new(grid: (usize, usize, usize), block: usize, smem: usize) -> Result<Launch> {
        let bad = |why: String| Err(KernelError::Unsupported(format!("CUDA launch: {why}")));
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return bad(format!("empty grid {grid:?}"));
        }
        if grid.0 > MAX_GRID_X || grid.1 > MAX_GRID_YZ || grid.2 > MAX_GRID_YZ {
            return bad(format!("grid {grid:?} exceeds the device limits"));
        }
        if block == 0 || block > MAX_BLOCK_THREADS || !block.is_multiple_of(32) {
            return bad(format!(
                "{block} threads per block (want a multiple of 32, ≤ 1024)"
            ));
        }
        if smem > DEFAULT_SMEM_LIMIT {
            return bad(format!(
                "{smem} bytes of shared memory per block (limit {DEFAULT_SMEM_LIMIT})"
            ));
        }
        Ok(Launch {
            grid: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
            block: (block as u32, 1, 1),
            smem: smem as u32,
        })
    }

    /// Total threads launched.
    pub fn threads(&self) -> u64 {
        (self.grid.0 as u64 * self.grid.1 as u64 * self.grid.2 as u64) * self.block.0 as u64
    }

    /// cudarc's form.
    pub fn config(&self) -> cudarc::driver::LaunchConfig {
        cudarc::driver::LaunchConfig {
            grid_dim: self.grid,
            block_dim: self.block,
            shared_mem_bytes: self.smem,
        }
    }
}

/// Blocks of `per_block` items needed to cover `n` items (at least one).
pub fn blocks_for(n: usize, per_block: usize) -> usize {
    n.div_ceil(per_block.max(1)).max(1)
}

/// `value` as a kernel's `int` argument, or one line naming it.
pub fn int_arg(name: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        KernelError::Unsupported(format!(
            "{name} = {value} does not fit a kernel's int argument"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_limits() {
        let l = Launch::new((10, 2, 1), 128, 4096).unwrap();
        assert_eq!(l.threads(), 10 * 2 * 128);
        assert!(Launch::new((0, 1, 1), 128, 0).is_err());
        assert!(Launch::new((1, 70_000, 1), 128, 0).is_err());
        assert!(Launch::new((1, 1, 1), 100, 0).is_err());
        assert!(Launch::new((1, 1, 1), 2048, 0).is_err());
        assert!(Launch::new((1, 1, 1), 128, 49 * 1024).is_err());
        assert!(Launch::new((1, 1, 1), 128, 48 * 1024).is_ok());
    }

    #[test]
    fn block_counts() {
        assert_eq!(blocks_for(0, 64), 1);
        assert_eq!(blocks_for(64, 64), 1);
        assert_eq!(blocks_for(65, 64), 2);
        assert!(int_arg("n", 1 << 40).is_err());
        assert_eq!(int_arg("n", 7).unwrap(), 7);
    }
}
