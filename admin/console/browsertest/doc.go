// Package browsertest tests the operator console (package admin/console) in
// a real headless Chromium driven by chromedp, against real services. It is a
// module of its own so that chromedp stays out of the graph of every module
// that requires idemq.
package browsertest
