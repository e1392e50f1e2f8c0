# frozen_string_literal: true

# Accuracy workload `templates` (bench/accuracy.rb): a catalogue page rendered from three ERB
# templates with ERB#result_with_hash, again and again, as a plain Rack application or a mailer
# renders. No truth measured.
#
#   ruby bench/accuracy/templates.rb [SECONDS]   (default 3)
#
# Each template is compiled to Ruby once (ERB.new); each render evals that Ruby (ERB#result:
# `Kernel#eval` with a binding made from TOPLEVEL_BINDING), so the template's code runs in
# eval'd frames of file `(erb)`, and each render pays `Kernel#eval`'s parse and compile. Unlike
# `erb` (bench/accuracy/erb.rb: one template compiled into a method with ERB#def_method, as
# Rails compiles its views), the CPU here is in code that has no method of its own: the
# catalogue's loop over 200 products, a footer and the layout around them, with helpers of
# the usual kind (`price`, `stars`, `h`). stackprof names that code by the label Ruby gives an eval's iseq (`block (2 levels)
# in <main>`), ours by its file, `(erb)` (docs/profiler.md, "Frame names"): the analysis
# names stackprof's frames of a file in parentheses by the file (AccuracyAnalysis.frame_name).
require "erb"

module TemplatesWorkload
  Product = Struct.new(:sku, :name, :cents, :rating, :tags, :stock)

  LAYOUT = ERB.new(<<~'HTML', trim_mode: "-")
    <!DOCTYPE html>
    <html><head><title><%= helpers.h(title) %></title></head>
    <body>
    <h1><%= helpers.h(title) %></h1>
    <%= body -%>
    <%= footer -%>
    </body></html>
  HTML

  CATALOGUE = ERB.new(<<~'HTML', trim_mode: "-")
    <table class="catalogue">
    <%- products.each_slice(4).with_index do |row, r| -%>
      <tr class="<%= r.even? ? "even" : "odd" %>">
      <%- row.each do |product| -%>
        <td><div class="product<%= " sold-out" if product.stock.zero? %>" id="sku-<%= product.sku %>">
          <h2><%= helpers.h(product.name) %></h2>
          <p class="price"><%= helpers.price(product.cents) %></p>
          <p class="rating"><%= helpers.stars(product.rating) %> (<%= product.rating %>/5)</p>
          <ul class="tags"><%- product.tags.each do |tag| -%><li><%= helpers.h(tag) %></li><%- end -%></ul>
          <%- if product.stock < 5 -%><p class="low">Only <%= product.stock %> left</p><%- end -%>
        </div></td>
      <%- end -%>
      </tr>
    <%- end -%>
    </table>
  HTML

  FOOTER = ERB.new(<<~'HTML', trim_mode: "-")
    <footer><%= products.size %> products, <%= helpers.price(products.sum(&:cents)) %> in all,
    <%= products.count { |product| product.stock.zero? } %> sold out</footer>
  HTML

  # The helpers, passed to the templates as a local (a template's self is the top level).
  module Helpers
    module_function

    def h(text)
      ERB::Util.html_escape(text)
    end

    def price(cents)
      units = (cents / 100).to_s.gsub(/(\d)(?=(\d{3})+\z)/, '\1,')
      format("$%s.%02d", units, cents % 100)
    end

    def stars(rating)
      Array.new(5) { |i| i < rating ? "★" : "☆" }.join
    end
  end

  WORDS = %w[oak linen <b>bold</b> "quoted" Tom&Jerry café déjà-vu lamp shelf chair copper woven
             O'Brien 50% >limit< teak].freeze

  def self.products(count = 200)
    random = Random.new(7)
    Array.new(count) do |i|
      Product.new(5000 + i, "#{WORDS.sample(random: random).capitalize} #{WORDS.sample(random: random)}",
                  random.rand(300..900_000), random.rand(1..5), WORDS.sample(1 + random.rand(4), random: random),
                  random.rand(0..20))
    end
  end

  def self.page(products)
    body = CATALOGUE.result_with_hash(products: products, helpers: Helpers)
    footer = FOOTER.result_with_hash(products: products, helpers: Helpers)
    LAYOUT.result_with_hash(title: "Catalogue <spring>", body: body, footer: footer, helpers: Helpers)
  end

  def self.run(seconds)
    products = self.products
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    pages = 0
    bytes = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      bytes += page(products).bytesize
      pages += 1
    end
    [pages, bytes / pages]
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  pages, size = TemplatesWorkload.run(seconds)
  puts "templates: #{pages} pages of #{size} bytes in #{seconds} s"
end
