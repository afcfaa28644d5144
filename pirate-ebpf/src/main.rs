//! pirated's XDP programs. `pirate_root` attaches to the interface and tail-calls the enabled
//! capabilities (`rli`, `pirate`, `fridge`, `segment`) in `CHAIN` order, then the forwarder
//! slots (Katran's balancer or the built-in `pirate_lb`), then passes; the first of them that
//! reads the packet's context parses the frame into it, once.
//! Measuring programs never drop or alter a packet (but `rli`'s reference packets, which the
//! upstream point sent to the downstream one): every failure is counted and passed on.
#![no_std]
#![allow(internal_features)]
#![feature(core_intrinsics)]
#![no_main]

mod bench;
mod chain;
mod fridge;
mod lb;
mod maps;
mod pirate;
mod rli;
mod root;
mod segment;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
