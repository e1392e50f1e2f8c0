# frozen_string_literal: true

# Accuracy workload `erb` (bench/accuracy.rb): an HTML page of orders rendered from an ERB
# template (stdlib erb) again and again, as a web application's view does. No truth measured.
#
#   ruby bench/accuracy/erb.rb [SECONDS]         (default 3)
#
# The template (TEMPLATE) is compiled once into `OrdersView#render` (ERB#def_method, as Rails
# compiles its views), then rendered over 60 orders (seeded, so every run renders the same
# page) until SECONDS have passed: a table row per order with helpers of the usual kind
# (`link_to`, `format_price` with thousands separators, `format_date`, `truncate`,
# `row_class`) and every value escaped with ERB::Util.h (in Ruby 3.1, CGI.escapeHTML: a C
# method of a few hundred nanoseconds). Most of the CPU is the template's own Ruby code and
# the helpers'; the many short C calls (`h`, `String#<<`/concat, `Integer#to_s`, `strftime`,
# `gsub`, `join`) are where a biased sampler misplaces it.
require "erb"

module ErbWorkload
  Order = Struct.new(:id, :customer, :email, :total_cents, :tags, :placed_at, :note, :status)

  TEMPLATE = <<~'HTML'
    <h1><%= h(title) %></h1>
    <p class="summary"><%= orders.size %> orders, <%= format_price(orders.sum(&:total_cents)) %> in total</p>
    <table class="orders">
      <thead>
        <tr><th>#</th><th>Customer</th><th>Email</th><th>Total</th><th>Tags</th><th>Placed</th><th>Note</th></tr>
      </thead>
      <tbody>
    <%- orders.each_with_index do |order, i| -%>
        <tr class="<%= row_class(i, order) %>">
          <td><%= order.id %></td>
          <td><%= link_to(order.customer, "/customers/#{order.id}?ref=orders&page=1") %></td>
          <td><%= h(order.email) %></td>
          <td class="num"><%= format_price(order.total_cents) %></td>
          <td><%- order.tags.each do |tag| -%><span class="tag"><%= h(tag) %></span> <%- end -%></td>
          <td><%= format_date(order.placed_at) %></td>
          <td title="<%= h(order.note) %>"><%= h(truncate(order.note, 32)) %></td>
        </tr>
    <%- end -%>
      </tbody>
    </table>
  HTML

  # The view: the compiled template plus its helpers.
  class OrdersView
    include ERB::Util

    attr_reader :title, :orders

    def initialize(title, orders)
      @title = title
      @orders = orders
    end

    def link_to(text, url)
      %(<a href="#{h(url)}">#{h(text)}</a>)
    end

    def format_price(cents)
      units = (cents / 100).to_s.gsub(/(\d)(?=(\d{3})+\z)/, '\1,')
      format("$%s.%02d", units, cents % 100)
    end

    def format_date(time)
      time.strftime("%b %-d, %Y %H:%M")
    end

    def truncate(text, length)
      text.length > length ? "#{text[0, length - 1]}…" : text
    end

    def row_class(index, order)
      classes = [index.even? ? "even" : "odd"]
      classes << "status-#{order.status}"
      classes << "large" if order.total_cents > 100_000
      classes.join(" ")
    end

    ERB.new(TEMPLATE, trim_mode: "-").def_method(self, "render", "orders.html.erb")
  end

  WORDS = %w[fast blue order <b>bold</b> "quoted" Tom&Jerry café déjà-vu invoice refund gift wrap express
             fragile O'Brien 50% >limit< urgent].freeze
  STATUSES = %w[pending paid shipped refunded].freeze

  def self.orders(count = 60)
    random = Random.new(11)
    base = Time.utc(2024, 3, 1, 9, 30)
    Array.new(count) do |i|
      Order.new(1000 + i, "#{WORDS.sample(random: random).capitalize} #{WORDS.sample(random: random)}",
                "user#{i}+#{WORDS.sample(random: random)}@example.com", random.rand(200..2_500_000),
                WORDS.sample(1 + random.rand(3), random: random), base + (i * 5417),
                Array.new(4 + random.rand(8)) { WORDS.sample(random: random) }.join(" "), STATUSES.sample(random: random))
    end
  end

  def self.run(seconds)
    view = OrdersView.new("Orders <March>", orders)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    pages = 0
    bytes = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      bytes += view.render.bytesize
      pages += 1
    end
    [pages, bytes / pages]
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  pages, size = ErbWorkload.run(seconds)
  puts "erb: #{pages} pages of #{size} bytes in #{seconds} s"
end
