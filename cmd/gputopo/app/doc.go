// Package app builds gputopo's cobra command tree. Each subcommand binds the
// options of one component package and calls its Run; nothing here decides
// behaviour. It may import every component; components never import it.
package app
