// Package display owns what vmsup does with a running VM's graphical
// console ([display]) apart from QEMU's argv (package qemuargs renders
// that): a screenshot (QMP screendump into the VM's state directory, read
// back as PPM, handed out as an image for PNG), the VNC socket a client is
// connected to, and the one-time VNC password of a session (QMP
// set_password and expire_password) for a VM whose server asks for one.
//
// It does not listen anywhere: handing a session to a VNC client or a
// browser is package vncproxy's.
package display
